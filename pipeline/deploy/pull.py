"""pull: the artifact a node should serve, and everything it serves from, in one directory,
with the command that serves it here.

    with Context() as ctx:
        pulled = pull(ctx, None, "/models", model="llama-3.3-70b-instruct", gpu="auto")
        os.execv(pulled.argv[0], pulled.argv)

1. What: a REF (digest, prefix or alias; only `ready` artifacts, or `superseded` ones for a
   rollback, unless *allow_unready*; an alias whose target cannot run on this node's
   TensorRT / TensorRT-LLM / vLLM gives its latest earlier target that can, with a note:
   `pipeline.deploy.node.fitting_target`), or the best candidate `resolve` ranks for this node
   (`gpu="auto"`: nvidia-smi's GPU and driver and the TRT-LLM, TensorRT, CUDA and vLLM
   versions installed here — the fingerprint whose latest proof ranks first, or the nearest
   one, said as such; `Pulled.evidence` is the proof used). Only what passed a smoke on this
   node's SKU is pulled: one proven only elsewhere (another SKU, the CPU) is exit 6 naming
   where it was proven, unless *allow_unproven*; then `Pulled.unproven` and serve.json's
   `unproven` say `unproven on <SKU> (proven on …)`.
2. Its serve template (`pipeline.deploy.command`) and the runtime executable found on this
   node (`pipeline.deploy.runtime`), both before a byte is downloaded.
3. The files: the artifact's, plus its checkpoint's for an entry that serves `inputs[0]`,
   merged into one manifest (a path in both must have the same content) and placed like
   `fetch` places one (through the cache, verified, hard links), with `serve.json` (below),
   all or nothing (`registry.ops.placement`). A second pull is a cache hit: no byte is
   downloaded, and with the manifests kept in the cache no store request made.

A compiled engine is served with a tokenizer directory, `DIR/tokenizer`: the source model's
HF config.json, tokenizer files and chat template (trtllm-serve loads the model config from
its --tokenizer path). An engine built here or imported with `--tokenizer-from` carries it;
for one published before engines did, pull follows the engine's provenance (its inputs, then
theirs) to the hf-checkpoint it was built from and places that checkpoint's config.json and
tokenizer files there, without its weights. When there is none, pull says so: such an engine
answers completions but not chat.

`serve.json` (schema `enginectl.serve/v1`) holds the digest, kind, model, runtime, the
executable found here, the argv for this node (`{model_dir}` filled in, `--host`/`--port` as
asked, an engine's `--tokenizer`), the served model name, the tokenizer directory (None where
the runtime needs none or none was found), the digests placed, how it is unproven here
(`unproven`: null when a smoke passed on this node's fingerprint), and the warm cache
(`pipeline.deploy.warm`): its digest, the runtime's cache variables (`env`, relative to
`cwd`, the directory itself) — a server started from serve.json runs in `cwd` with `env`
set; without a warm cache `env` is empty and argv runs from anywhere. What DIR may be, and what
in it may be replaced, is the one target rule (`registry.ops.target`), checked first."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.deploy.command import Template, node_argv, served_name, template
from pipeline.deploy.node import NodeOptions, fitting_target, model_request, resolved
from pipeline.deploy.refit import Refitted, check_refit_here, needs_refit, refit_placed
from pipeline.deploy.runtime import RuntimeExecutable, find_runtime
from pipeline.deploy.tokenizer import Tokenizer, engine_tokenizer
from pipeline.deploy.warm import WARM_DIR, Warm, node_key, place_warm
from registry.errors import ManifestError, UnreadyError, UsageError
from registry.identity.manifest import FileEntry, Manifest
from registry.ops.fetch import artifact_manifest, cached_manifest, check_target, find, lazy_store
from registry.ops.fetch_files import Verify, fill
from registry.ops.marker import MARKER, SERVE_FILE, SERVE_SCHEMA, write_json
from registry.ops.placement import placing
from registry.sql.lookup import Found
from registry.tokenizer import TOKENIZER_DIR

if TYPE_CHECKING:
    from registry.context import Context
    from registry.gpus import GpuSpec
    from registry.ops.resolve import Request
    from registry.ops.target import Target
    from registry.progress import Progress

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
    tokenizer_dir: str | None = None  # an engine's --tokenizer directory, when it has one
    evidence: dict[str, Any] | None = None  # the proof resolve ranked it by (no REF)
    unproven: str | None = None  # `unproven on <SKU> (…)` (--allow-unproven), None if proven
    warm_cache: str | None = None  # the warm cache placed in DIR/.warm (pipeline.deploy.warm)
    warm_use: str | None = None  # what the runtime did with it at its last smoke start
    env: dict[str, str] = field(default_factory=dict)  # its variables, relative to DIR
    refit: dict[str, Any] | None = None  # a weight-stripped engine's (pipeline.deploy.refit)

    @property
    def command(self) -> str:
        """The argv as one shell-quoted line: what `enginectl pull` prints (with a warm
        cache, started from DIR with the runtime's cache variables)."""
        if not self.env:
            return shlex.join(self.argv)
        variables = [f"{name}={value}" for name, value in sorted(self.env.items())]
        return (f"cd {shlex.quote(str(self.directory))} && "
                f"{shlex.join(['env', *variables, *self.argv])}")

    def serve_json(self) -> dict[str, Any]:
        """The content of `serve.json`."""
        return {
            "schema": SERVE_SCHEMA, "digest": self.digest, "kind": self.kind, "model": self.model,
            "runtime": self.runtime, "executable": self.executable, "argv": self.argv,
            "host": self.host, "port": self.port, "model_dir": str(self.directory),
            "served_model_name": self.served_model_name, "sources": list(self.sources),
            "tokenizer_dir": self.tokenizer_dir, "cwd": str(self.directory),
            "env": dict(self.env), "warm_cache": self.warm_cache, "unproven": self.unproven,
            "refit": self.refit,
        }

    def as_dict(self) -> dict[str, Any]:
        return {**self.serve_json(), "directory": str(self.directory), "command": self.command,
                "downloaded_bytes": self.downloaded_bytes, "cached_bytes": self.cached_bytes,
                "notes": list(self.notes), "evidence": self.evidence, "warm_use": self.warm_use}


@dataclass(frozen=True)
class Selection:
    """What to pull, decided before anything is downloaded."""

    found: Found
    manifest: Manifest
    template: Template
    sources: tuple[Manifest, ...]  # the artifact's manifest first, then its checkpoint's
    notes: tuple[str, ...] = field(default=())
    tokenizer: Tokenizer | None = None  # an engine's tokenizer directory (module doc)
    evidence: dict[str, Any] | None = None  # resolved: the proof used and how near it is
    unproven: str | None = None  # resolved: `unproven on <SKU> (…)`; None when proven here


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


def select(ctx: Context, ref: str | None, *, request: Request | None = None,
           allow_unready: bool = False) -> Selection:
    """The artifact *ref* names, or (no *ref*) the best one resolve ranks for *request*,
    with its template and the manifests of everything it serves from."""
    notes: tuple[str, ...]
    manifest: Manifest | None = None
    evidence = unproven = None
    if ref is not None:
        found = find(ctx, ref, verb="pull")  # the registry's driver alone: no SQLAlchemy
        if found.status is None:  # the registry does not list it: is it in the store at all?
            manifest = artifact_manifest(lazy_store(ctx), ctx.cache, found)  # else exit 6
        fitted = fitting_target(ctx, ref, found)  # an alias: what runs on this toolchain
        if fitted is None:
            notes = ref_notes(found, allow_unready=allow_unready)
        else:
            found, notes = fitted[0], (fitted[1],)
    elif request is not None:
        found, notes, evidence, unproven = resolved(ctx, request)
    else:
        raise UsageError("pull needs a REF or --model")
    if manifest is None:
        manifest = _manifest(ctx, found.digest)
    how = template(found.digest, manifest.kind, manifest.labels, manifest.serve)
    sources = [manifest]
    if how.model_dir == "input":
        if not manifest.inputs:
            raise ManifestError(f"{found.digest} serves its input checkpoint but records none")
        checkpoint = find(ctx, manifest.inputs[0], verb="pull")  # refused when deleted
        sources.append(_manifest(ctx, checkpoint.digest))
    tokenizer = None
    if how.runtime == "trtllm":
        tokenizer = engine_tokenizer(ctx, manifest)
        if tokenizer is None:
            notes = (*notes, (f"{found.digest} has no tokenizer directory and no source "
                              "checkpoint in its provenance: it serves completions but not "
                              "chat; re-import it with `enginectl import DIR --kind "
                              "trtllm-engine --tokenizer-from HF_DIR|REF`"))
    return Selection(found, manifest, how, tuple(sources), notes, tokenizer, evidence, unproven)


def _manifest(ctx: Context, digest: str) -> Manifest:
    """The manifest of *digest*, from the fetch cache's copy when it has one, else from the
    store, keeping a copy (`registry.ops.fetch.cached_manifest`): a cache-hit pull needs no
    store request at all."""
    return cached_manifest(lazy_store(ctx), ctx.cache, digest)


def merged(selection: Selection) -> Manifest:
    """One manifest with the files of every source; a path in two of them must have the
    same content, and none may be `serve.json`. Pure."""
    files: dict[str, FileEntry] = {}
    owner: dict[str, str] = {}
    parts = [(str(source.digest), source.files) for source in selection.sources]
    if selection.tokenizer is not None and selection.tokenizer.source is not None:
        parts.append((selection.tokenizer.source, selection.tokenizer.files))
    for digest, entries in parts:
        for entry in entries:
            if entry.path in (SERVE_FILE, MARKER):
                raise ManifestError(f"{digest} has a file {entry.path!r}, which pull "
                                    "writes itself; fetch it instead")
            known = files.get(entry.path)
            if known is not None and (known.xxh3, known.size) != (entry.xxh3, entry.size):
                raise ManifestError(
                    f"{entry.path!r} is in {owner[entry.path]} and in {digest} with "
                    f"different content ({known.xxh3} vs {entry.xxh3}); they cannot share "
                    "one directory")
            files[entry.path] = entry
            owner.setdefault(entry.path, digest)
    first = selection.manifest
    return Manifest(kind=first.kind, files=tuple(files.values()), labels=first.labels,
                    key=first.key, toolchain=first.toolchain, inputs=first.inputs,
                    serve=first.serve)


# --- where ------------------------------------------------------------------------------------


def pulled_for(selection: Selection, runtime: RuntimeExecutable, dest: Path, *, host: str,
               port: int, downloaded_bytes: int = 0, cached_bytes: int = 0,
               warm: Warm | None = None, refit: Refitted | None = None) -> Pulled:
    """What serves *selection* from *dest* on this node (with *warm*'s cache, if any). Pure."""
    tokenizer = selection.tokenizer
    tokenizer_dir = None if tokenizer is None else str(dest / TOKENIZER_DIR)
    argv = node_argv(selection.template, executable=runtime.executable, model_dir=str(dest),
                     host=host, port=port, tokenizer_dir=tokenizer_dir)
    if warm is not None:
        argv = warm.argv(argv)
    manifest = selection.manifest
    sources = tuple(str(m.digest) for m in selection.sources)
    if tokenizer is not None and tokenizer.source is not None:
        sources += (tokenizer.source,)
    return Pulled(
        directory=dest, digest=selection.found.digest, kind=manifest.kind,
        model=str(manifest.labels.get("model") or ""), runtime=runtime.name,
        executable=runtime.executable, argv=argv, host=host, port=port,
        served_model_name=served_name(argv, runtime.name, str(dest)),
        sources=sources, downloaded_bytes=downloaded_bytes, cached_bytes=cached_bytes,
        notes=selection.notes + ((warm.note,) if warm and warm.note else ())
        + ((refit.note,) if refit else ()),
        tokenizer_dir=tokenizer_dir, evidence=selection.evidence,
        unproven=selection.unproven,
        warm_cache=None if warm is None else warm.digest,
        warm_use=None if warm is None else warm.used,
        env={} if warm is None else dict(warm.env),
        refit=None if refit is None else refit.as_dict(),
    )


def place(ctx: Context, selection: Selection, target: Target, *, runtime: RuntimeExecutable,
          host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, verify: Verify = "fast",
          progress: Progress | None = None, warm: bool = True) -> Pulled:
    """Put *selection*'s files and `serve.json` at *target* (`check_target`'s), all or
    nothing (`registry.ops.placement`); with *warm*, this node's warm cache in `.warm/`."""
    dest = target.path
    pulled_for(selection, runtime, dest, host=host, port=port)  # refuses an unknown argv early
    with placing(target, by="pull", digest=selection.found.digest) as placed:
        fetched = fill(lazy_store(ctx), merged(selection), placed.tree, cache=ctx.cache,
                       verify=verify, progress=progress, named=dest)
        refit = refit_placed(ctx, selection.manifest, placed.tree, progress=progress)
        kept = (place_warm(ctx, selection.manifest, placed.tree, node_key(selection.manifest))
                if warm else None)
        pulled = pulled_for(selection, runtime, dest, host=host, port=port,
                            downloaded_bytes=fetched.downloaded_bytes
                            + (refit.downloaded_bytes if refit else 0),
                            cached_bytes=fetched.cached_bytes, warm=kept, refit=refit)
        write_json(placed.tree / SERVE_FILE, pulled.serve_json())
        source = selection.tokenizer.source if selection.tokenizer else None
        placed.record(sources=[str(m.digest) for m in selection.sources]
                      + ([refit.manifest] if refit and refit.manifest else []),
                      under=[(TOKENIZER_DIR, source)] if source else [],
                      writable={WARM_DIR: kept.digest} if kept and kept.digest else {})
    return pulled


@dataclass(frozen=True)
class PullOptions(NodeOptions):
    """The rarer choices of `pull`: `NodeOptions`, and how the files are checked and
    whether a directory an earlier pull or fetch filled may be replaced."""

    verify: Verify = "fast"  # --verify strict: sha256 as well as xxh3
    force: bool = False  # --force (`registry.ops.target`)


def pull(
    ctx: Context,
    ref: str | None,
    dest: Path | str,
    *,
    model: str | None = None,
    gpu: str | GpuSpec = "auto",
    min_seq_len: int | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    executable: str | None = None,
    options: PullOptions = PullOptions(),
) -> Pulled:
    """Pull *ref*, or (with *model* and no *ref*) what resolve ranks first for *gpu*, into
    *dest*, and write the command that serves it on this node, on *host* and *port*, with
    *executable* (default: found here, `pipeline.deploy.runtime`) (module doc); the rarer
    choices are *options*."""
    request = model_request("pull", ref, model, gpu, min_seq_len=min_seq_len, options=options,
                            ctx=ctx)
    target = check_target(ctx, dest, verb="pull", force=options.force, verify=options.verify)
    selection = select(ctx, ref, request=request, allow_unready=options.allow_unready)
    runtime = find_runtime(selection.template.runtime, executable=executable)
    if needs_refit(selection.manifest):  # refitted here, so trtllm-refit must be here too
        check_refit_here()
    ctx.begin(store=False)  # a cache hit needs no store
    return place(ctx, selection, target, runtime=runtime, host=host, port=port,
                 verify=options.verify, progress=options.progress, warm=options.warm)
