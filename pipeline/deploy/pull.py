"""pull: the artifact a node should serve, and everything it serves from, in one directory,
with the command that serves it here.

    with Context() as ctx:
        pulled = pull(ctx, None, "/models", model="llama-3.3-70b-instruct", gpu="auto")
        os.execv(pulled.argv[0], pulled.argv)

1. What: a REF (digest, prefix or alias; only `ready` artifacts, or `superseded` ones for a
   rollback, unless *allow_unready*), or the best candidate `resolve` ranks for this node
   (`gpu="auto"`: nvidia-smi's GPU and the TRT-LLM/TensorRT versions installed here).
2. Its serve template (`pipeline.deploy.command`) and the runtime executable found on this
   node (`pipeline.deploy.runtime`), both before a byte is downloaded.
3. The files: the artifact's, plus its checkpoint's for an entry that serves `inputs[0]`,
   merged into one manifest (a path in both must have the same content) and placed like
   `fetch` places one (through the cache, verified, hard links), with `serve.json` (below),
   all or nothing (`pipeline.deploy.target`: a staging directory renamed into place, or,
   for a mount point, filled in place with `serve.json` last). A second pull is a cache hit:
   no byte is downloaded, and with the manifests kept in the cache no store request made.

`serve.json` (schema `enginectl.serve/v1`) holds the digest, kind, model, runtime, the
executable found here, the argv for this node (`{model_dir}` filled in, `--host`/`--port` as
asked), the served model name and the digests placed. What DIR may be, and what in it may
be replaced, is `pipeline.deploy.guard.check_target`'s one rule, checked before anything is
read: an absent or empty directory, or one an earlier pull filled (with *force*, an earlier
fetch too), and never the store, the cache, a home or the working directory.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.deploy.command import Template, node_argv, served_name, template
from pipeline.deploy.guard import MARKER, check_target, protected_places
from pipeline.deploy.runtime import Runtime, find_runtime
from pipeline.deploy.target import SCHEMA, SERVE_FILE, staged, write_json
from registry.errors import ManifestError, UnreadyError, UsageError
from registry.fetch import (
    Verify,
    artifact_manifest,
    cached_manifest,
    fetch_manifest,
    find,
    lazy_store,
)
from registry.lookup import Found
from registry.manifest import FileEntry, Manifest

if TYPE_CHECKING:
    from registry.context import Context
    from registry.gpus import GpuSpec
    from registry.progress import Progress
    from registry.resolve import Request

DEFAULT_HOST: Final = "0.0.0.0"  # noqa: S104 - a deploy node serves other machines
DEFAULT_PORT: Final = 8000


@dataclass(frozen=True)
class Pulled:
    """What `pull` placed, and how to serve it on this node."""

    directory: Path
    digest: str
    kind: str
    model: str
    runtime: str
    executable: str
    argv: list[str]
    host: str
    port: int
    served_model_name: str
    sources: tuple[str, ...]  # the digests whose files are in *directory*, the artifact first
    downloaded_bytes: int = 0
    cached_bytes: int = 0
    notes: tuple[str, ...] = ()  # what the caller should tell the user (stderr)

    @property
    def command(self) -> str:
        """The argv as one shell-quoted line: what `enginectl pull` prints."""
        return shlex.join(self.argv)

    def serve_json(self) -> dict[str, Any]:
        """The content of `serve.json`."""
        return {
            "schema": SCHEMA, "digest": self.digest, "kind": self.kind, "model": self.model,
            "runtime": self.runtime, "executable": self.executable, "argv": self.argv,
            "host": self.host, "port": self.port, "model_dir": str(self.directory),
            "served_model_name": self.served_model_name, "sources": list(self.sources),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**self.serve_json(), "directory": str(self.directory), "command": self.command,
                "downloaded_bytes": self.downloaded_bytes, "cached_bytes": self.cached_bytes,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Selection:
    """What to pull, decided before anything is downloaded."""

    found: Found
    manifest: Manifest
    template: Template
    sources: tuple[Manifest, ...]  # the artifact's manifest first, then its checkpoint's
    notes: tuple[str, ...] = field(default=())


# --- what -------------------------------------------------------------------------------------


def ref_notes(found: Found, *, allow_unready: bool) -> tuple[str, ...]:
    """Whether a REF may be pulled: `ready`, or `superseded` (proven once, what a rollback
    pulls) with a note; anything else only with *allow_unready*. Pure."""
    if found.status == "ready":
        return ()
    if found.status == "superseded":
        return (f"{found.digest} is superseded by a newer artifact; pulling it as a rollback",)
    status = found.status or "not in the registry"
    if not allow_unready:
        reason = found.reason or ("nothing records that it serves" if found.status is None
                                  else "not proven to serve")
        raise UnreadyError(found.digest, status, reason, verb="pull")
    return (f"{found.digest} is {status}"
            + (f" ({found.reason})" if found.reason else "")
            + "; pulled because of --allow-unready",)


def node_request(model: str, gpu: str | GpuSpec, *, gpu_count: int | None = None,
                 min_seq_len: int | None = None, min_batch: int | None = None,
                 prefer: Sequence[str] = ()) -> Request:
    """The resolve request for this node: *gpu* "auto" reads nvidia-smi (and the TRT-LLM and
    TensorRT versions installed here, which an engine must match), else a catalog name."""
    from pipeline.toolchain import local_gpu
    from registry.gpus import GpuSpec, UnknownGpuError, lookup_gpu
    from registry.resolve import Request

    toolchain: dict[str, Any] = {}
    if isinstance(gpu, GpuSpec):
        spec = gpu
    elif gpu == "auto":
        spec, counted = local_gpu()
        gpu_count = gpu_count or counted
        toolchain = _installed_toolchain()
    else:
        try:
            spec = lookup_gpu(gpu)
        except UnknownGpuError as exc:
            raise UsageError(f"--gpu: {exc}") from exc
    return Request(model=model, gpu=spec, gpu_count=gpu_count, min_seq_len=min_seq_len,
                   min_batch=min_batch, prefer=tuple(prefer), toolchain=toolchain)


def _installed_toolchain() -> dict[str, Any]:
    from pipeline.settings import Settings
    from pipeline.toolchain import probe

    found = probe(Settings.from_env().python).toolchain
    return {"trtllm": found.trtllm, "tensorrt": found.tensorrt}


def select(ctx: Context, ref: str | None, *, request: Request | None = None,
           allow_unready: bool = False) -> Selection:
    """The artifact *ref* names, or (no *ref*) the best one resolve ranks for *request*,
    with its template and the manifests of everything it serves from."""
    notes: tuple[str, ...]
    manifest: Manifest | None = None
    if ref is not None:
        found = find(ctx, ref)  # the registry's driver alone: no SQLAlchemy on this path
        if found.status is None:  # the registry does not list it: is it in the store at all?
            manifest = artifact_manifest(lazy_store(ctx), ctx.cache, found)  # else exit 6
        notes = ref_notes(found, allow_unready=allow_unready)
    elif request is not None:
        found, notes = _resolved(ctx, request)
    else:
        raise UsageError("pull needs a REF or --model")
    if manifest is None:
        manifest = _manifest(ctx, found.digest)
    how = template(found.digest, manifest.kind, manifest.labels, manifest.serve)
    sources = [manifest]
    if how.model_dir == "input":
        if not manifest.inputs:
            raise ManifestError(f"{found.digest} serves its input checkpoint but records none")
        checkpoint = find(ctx, manifest.inputs[0])  # refused when deleted
        sources.append(_manifest(ctx, checkpoint.digest))
    return Selection(found, manifest, how, tuple(sources), notes)


def _manifest(ctx: Context, digest: str) -> Manifest:
    """The manifest of *digest*, from the fetch cache's copy when it has one, else from the
    store, keeping a copy (`registry.fetch.cached_manifest`): a cache-hit pull needs no
    store request at all."""
    return cached_manifest(lazy_store(ctx), ctx.cache, digest)


def _resolved(ctx: Context, request: Request) -> tuple[Found, tuple[str, ...]]:
    from registry.errors import NothingResolvableError
    from registry.resolve import resolve

    ranked = resolve(ctx, request)
    sku = request.gpu.sku
    if not ranked.candidates or not ranked.candidates[0].proven:
        ranked = resolve(ctx, request, explain=True)  # the reasons, and where it is proven
    if not ranked.candidates:
        raise NothingResolvableError(
            request.model, sku, ranked.reasons(),
            next_step=f"`enginectl resolve --model {request.model} --gpu {sku} --explain` "
                      "lists the same; build, smoke or tag one for this GPU")
    best = ranked.candidates[0]
    note = best.unproven_note(sku)
    notes = () if note is None else (
        f"{best.digest} is {note}; `enginectl smoke {best.digest[:19]}` here proves it",)
    return Found(best.digest, best.status), notes


def merged(selection: Selection) -> Manifest:
    """One manifest with the files of every source; a path in two of them must have the
    same content, and none may be `serve.json`. Pure."""
    files: dict[str, FileEntry] = {}
    owner: dict[str, str] = {}
    for source in selection.sources:
        for entry in source.files:
            if entry.path in (SERVE_FILE, MARKER):
                raise ManifestError(f"{source.digest} has a file {entry.path!r}, which pull "
                                    "writes itself; fetch it instead")
            known = files.get(entry.path)
            if known is not None and (known.xxh3, known.size) != (entry.xxh3, entry.size):
                raise ManifestError(
                    f"{entry.path!r} is in {owner[entry.path]} and in {source.digest} with "
                    f"different content ({known.xxh3} vs {entry.xxh3}); they cannot share "
                    "one directory")
            files[entry.path] = entry
            owner.setdefault(entry.path, str(source.digest))
    first = selection.manifest
    return Manifest(kind=first.kind, files=tuple(files.values()), labels=first.labels,
                    key=first.key, toolchain=first.toolchain, inputs=first.inputs,
                    serve=first.serve)


# --- where ------------------------------------------------------------------------------------


def pulled_for(selection: Selection, runtime: Runtime, dest: Path, *, host: str, port: int,
               downloaded_bytes: int = 0, cached_bytes: int = 0) -> Pulled:
    """What serves *selection* from *dest* on this node. Pure."""
    argv = node_argv(selection.template, executable=runtime.executable, model_dir=str(dest),
                     host=host, port=port)
    manifest = selection.manifest
    return Pulled(
        directory=dest, digest=selection.found.digest, kind=manifest.kind,
        model=str(manifest.labels.get("model") or ""), runtime=runtime.name,
        executable=runtime.executable, argv=argv, host=host, port=port,
        served_model_name=served_name(argv, runtime.name, str(dest)),
        sources=tuple(str(m.digest) for m in selection.sources),
        downloaded_bytes=downloaded_bytes, cached_bytes=cached_bytes, notes=selection.notes,
    )


def place(ctx: Context, selection: Selection, dest: Path | str, *, runtime: Runtime,
          host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, verify: Verify = "fast",
          progress: Progress | None = None) -> Pulled:
    """Put *selection*'s files and its `serve.json` at *dest*, all or nothing
    (`pipeline.deploy.target.staged`), replacing what is there: *dest* is one `check_target`
    accepted (`pull`) or enginectl's own (`serve`'s serving directory)."""
    dest = Path(dest).absolute()
    pulled_for(selection, runtime, dest, host=host, port=port)  # refuses an unknown argv early
    with staged(dest, digest=selection.found.digest) as tree:
        fetched = fetch_manifest(lazy_store(ctx), merged(selection), tree, cache=ctx.cache,
                                 verify=verify, progress=progress, named=dest)
        pulled = pulled_for(selection, runtime, dest, host=host, port=port,
                            downloaded_bytes=fetched.downloaded_bytes,
                            cached_bytes=fetched.cached_bytes)
        write_json(tree / SERVE_FILE, pulled.serve_json())
    return pulled


def pull(
    ctx: Context,
    ref: str | None,
    dest: Path | str,
    *,
    model: str | None = None,
    gpu: str | GpuSpec = "auto",
    gpu_count: int | None = None,
    min_seq_len: int | None = None,
    min_batch: int | None = None,
    prefer: Sequence[str] = (),
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    executable: str | None = None,
    allow_unready: bool = False,
    verify: Verify = "fast",
    force: bool = False,
    progress: Progress | None = None,
) -> Pulled:
    """Pull *ref*, or (with *model* and no *ref*) what resolve ranks first for *gpu*, into
    *dest*, and write the command that serves it on this node (module doc)."""
    if (ref is None) == (model is None):
        raise UsageError("pull takes a REF or --model, not both")
    dest = check_target(dest, force=force, verb="pull", places=protected_places(ctx))
    request = None if model is None else node_request(
        model, gpu, gpu_count=gpu_count, min_seq_len=min_seq_len, min_batch=min_batch,
        prefer=prefer)
    selection = select(ctx, ref, request=request, allow_unready=allow_unready)
    runtime = find_runtime(selection.template.runtime, executable=executable)
    ctx.begin(store=False)  # a cache hit needs no store
    return place(ctx, selection, dest, runtime=runtime, host=host, port=port, verify=verify,
                 progress=progress)
