"""Refit on the node: a weight-stripped engine made whole where it will serve.

`pull` of a stripped engine (its manifest's `strip_plan` label) fetches the plan as any
artifact and its refit source, the TensorRT-LLM checkpoint named by `refit_source`, through
the fetch cache (a node that has the checkpoint for another shape moves only the plan), runs
`trtllm-refit` under this node's TensorRT-LLM and GPU, and places the whole engine.

Refitted engines are kept under the fetch cache's `refits/`, keyed by (plan digest,
checkpoint digest, this node's fingerprint: GPU SKU and SM, driver, CUDA, TensorRT,
TensorRT-LLM), so a restart or a second pull on the same node does not refit again; another
node, or this one after a driver or TensorRT-LLM change, refits anew. An entry is written
beside its place and renamed into it when whole; a refit that fails leaves none, and its log
stays under `refits/logs/`. `enginectl smoke` of a stripped engine serves the same
refitted directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.errors import RuntimeMissingError
from pipeline.host.runtimes import program
from pipeline.stages.refit import SOURCE_LABEL, refit, stripped_labels
from registry.errors import ManifestError
from registry.identity.digest import Digest, digest_file
from registry.identity.manifest import FileEntry

if TYPE_CHECKING:
    from registry.context import Context
    from registry.identity.manifest import Manifest
    from registry.progress import Progress

REFITS: Final = "refits"
REFIT_TIMEOUT_S: Final = 3600.0
SCRATCH: Final = ".refit-checkpoint"  # in a pull's tree: the checkpoint while it refits
FINGERPRINT: Final = ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm")


@dataclass(frozen=True)
class Refitted:
    """A refitted engine directory on this node, and how it came to be."""

    directory: Path
    checkpoint: str  # the refit source's digest
    seconds: float | None  # the refit's time; None when the cache had it
    downloaded_bytes: int = 0  # the checkpoint's bytes this refit downloaded
    cached_bytes: int = 0
    manifest: str | None = None  # the node-local manifest of the placed whole engine

    @property
    def note(self) -> str:
        """What `pull` says about it."""
        if self.seconds is None:
            return "weight-stripped: the engine refitted on this node before was reused"
        return (f"weight-stripped: refitted from checkpoint {self.checkpoint[:19]} in "
                f"{self.seconds:.1f} s ({self.downloaded_bytes} bytes of it downloaded)")

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "seconds": self.seconds,
                "cached": self.seconds is None, "directory": str(self.directory),
                "checkpoint_downloaded_bytes": self.downloaded_bytes,
                "checkpoint_cached_bytes": self.cached_bytes, "manifest": self.manifest}


def needs_refit(manifest: Manifest) -> bool:
    return manifest.kind == "trtllm-engine" and stripped_labels(manifest.labels)


def check_refit_here() -> str:
    """trtllm-refit on this node (pull checks it before any byte is downloaded)."""
    found = program("trtllm-refit")
    if found is None:
        raise RuntimeMissingError("weight-stripped trtllm", "trtllm-refit is not on PATH (run "
                                  "in the TensorRT-LLM image, or pull a whole engine)")
    return found


def refit_key(plan: str, checkpoint: str, fingerprint: dict[str, Any]) -> str:
    """The cache key of a refit. Pure."""
    node = {name: fingerprint.get(name) for name in FINGERPRINT}
    text = json.dumps({"plan": plan, "checkpoint": checkpoint, "node": node}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def refitted_engine(ctx: Context, manifest: Manifest, plan_dir: Path, scratch: Path, *,
                    progress: Progress | None = None) -> Refitted:
    """The whole engine of stripped *manifest* (its files in *plan_dir*) for this node: from
    the refit cache, else refitted now from its checkpoint, fetched through the fetch cache
    into *scratch* (absent; a fetch never writes inside the cache; removed after). RefitError
    (exit 3, the log's tail) when trtllm-refit fails; nothing is kept then."""
    from pipeline.deploy.node import installed_toolchain
    from registry.ops.fetch import cached_manifest, lazy_store
    from registry.ops.fetch_files import fetch_manifest

    source = manifest.labels.get(SOURCE_LABEL)
    if not isinstance(source, str):
        raise ManifestError(f"{manifest.digest} is weight-stripped but names no refit source")
    root = ctx.cache.root / REFITS
    key = refit_key(str(manifest.digest), source, installed_toolchain().as_dict())
    place = root / key[:2] / key
    if (place / "config.json").is_file():
        return Refitted(place, source, None)
    checkpoint = cached_manifest(lazy_store(ctx), ctx.cache, source)
    output = root / f".tmp-{uuid.uuid4().hex}"
    try:
        fetched = fetch_manifest(lazy_store(ctx), checkpoint, scratch, cache=ctx.cache,
                                 progress=progress)
        if progress is not None:
            progress.start("refitting", 0)
        log = root / "logs" / f"{key}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        seconds = refit(plan_dir, scratch, output, log_path=log, timeout_s=REFIT_TIMEOUT_S,
                        key=str(manifest.digest))
        if progress is not None:
            progress.finish()
        place.parent.mkdir(parents=True, exist_ok=True)
        try:
            output.rename(place)
        except OSError:  # another pull placed it first: theirs is the same engine
            if not (place / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(output, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return Refitted(place, source, seconds, fetched.downloaded_bytes, fetched.cached_bytes)


def refit_placed(ctx: Context, manifest: Manifest, tree: Path, *,
                 progress: Progress | None = None) -> Refitted | None:
    """For `pull`: when *manifest* is weight-stripped, its whole engine for this node in
    *tree* (where its plan was placed), the rank engines replaced (hard links into the refit
    cache where the file system allows, else copies); None for any other artifact. The
    placed engine's own manifest, the plan's with the refitted rank files, is kept in the
    fetch cache (node-local, never published) so the fill marker proves those files."""
    if not needs_refit(manifest):
        return None
    refitted = refitted_engine(ctx, manifest, tree, tree / SCRATCH, progress=progress)
    entries = {entry.path: entry for entry in manifest.files}
    for engine in sorted(refitted.directory.glob("rank*.engine")):
        target = tree / engine.name
        target.unlink(missing_ok=True)
        try:
            os.link(engine, target)
        except OSError:
            shutil.copy2(engine, target)
        entries[engine.name] = _entry(engine)
    whole = replace(manifest, files=tuple(entries[path] for path in sorted(entries)),
                    inputs=(str(manifest.digest), refitted.checkpoint), key=None)
    ctx.cache.keep_manifest(whole.digest, whole.to_bytes())
    return replace(refitted, manifest=str(whole.digest))


def _entry(path: Path) -> FileEntry:
    """The manifest entry of a refitted rank engine, hashed once and kept beside it."""
    kept = path.with_name(f".{path.name}.digests")
    try:
        size, xxh3, sha256 = kept.read_text(encoding="ascii").split()
        return FileEntry(path.name, int(size), Digest.parse(xxh3), Digest.parse(sha256))
    except (OSError, ValueError):
        found = digest_file(path, mapped=True)  # the refit cache's own file
    assert found.sha256 is not None  # noqa: S101 - asked for with_sha256
    entry = FileEntry(path.name, found.size, found.xxh3, found.sha256)
    with contextlib.suppress(OSError):
        kept.write_text(f"{entry.size} {entry.xxh3} {entry.sha256}\n", encoding="ascii")
    return entry
