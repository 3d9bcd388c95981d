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
`compare` shows beside the cold one.

Capture (`capture`): after a passing smoke, the files under `.warm/` (lock and temp files
left out; of the server's TMPDIR only Inductor's precompiled headers, `pipeline.deploy.warm.
kept`) are copied aside with every occurrence of the serving directory's absolute path, and of the
model directory's, overwritten by a neutral string of the same length (compiled objects keep
their build path in debug strings; vLLM's AOT artifact records its Inductor directory):
nothing host-specific is published. The copy is published as a `warm-cache` artifact, status
`ready`, labelled with the digest it belongs to (`artifact`), its inputs the same digest.
An engine served by TensorRT (`trtllm-serve --backend tensorrt`) tunes nothing at start,
nor does vLLM with `--enforce-eager`: they have no warm cache, and start as before.

The key, the layouts and the argv of a warm start live in `pipeline.deploy.warm`, which
`pull` uses (the room below this one); this module starts a smoke's server so that its caches
can be captured (`launch`), and captures them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from pipeline.stages.serve import vllm_model

if TYPE_CHECKING:
    from pipeline.settings import Settings
    from registry.context import Context

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
    from pipeline.planning.toolchain import probe
    from registry.ops.fetch import load_manifest

    if started is None:
        return None
    manifest = load_manifest(ctx, artifact)
    fingerprint = probe(settings).toolchain
    template = list((manifest.serve or {}).get("argv") or started.argv)
    key = warm_key(artifact, template, fingerprint)
    placed = place_warm(ctx, manifest, started.cwd, key)
    return replace(started, key=key, fingerprint=fingerprint.as_dict(), seeded=placed.digest)


def neutral(length: int) -> bytes:
    """A path-shaped string of *length* bytes that names no place on any host."""
    return ("/enginectl-warm-cache" + "_" * length)[:length].encode()


def copy_neutral(source: Path, dest: Path, host_paths: Sequence[str]) -> int:
    """Copy the files under *source* to *dest* (lock and temp files left out), overwriting
    each of *host_paths* in their bytes with `neutral` of its length; the number copied."""
    patterns = sorted({p.encode() for p in host_paths if p}, key=len, reverse=True)
    copied = 0
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_symlink() or not path.is_file() or not kept(relative):
            continue
        data = path.read_bytes()
        for pattern in patterns:
            data = data.replace(pattern, neutral(len(pattern)))
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        copied += 1
    return copied


def capture(ctx: Context, started: Launch, *, artifact: str,
            labels: Mapping[str, Any]) -> str | None:
    """Publish what the server started by *started* (after `seed`) wrote under `.warm/` as
    *artifact*'s warm cache (module doc); its digest, or None when it wrote nothing or has
    no key."""
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
        if not copy_neutral(started.cwd / WARM_DIR, staging, hosts):
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
