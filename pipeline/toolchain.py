"""Toolchain fingerprints, which parts of one each stage's key depends on, and which
fingerprint each target's stages are keyed with.

A **pool** is where stage runs execute: this machine for the local executor (pool
`host:<hostname>`), or the nodes of a Ray cluster that offer one GPU SKU (pool = the SKU).
A build keys every stage with the fingerprint probed on the pool that runs it; `plan` uses
the fingerprint last recorded for that pool (the `toolchains` table), or the builder image's
versions (`BUILDER_IMAGE`) with a note when none is recorded. The recipe's `toolchain` pins go
on top; `rebuild_on` is the policy: which fields force a rebuild.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from pipeline.recipe import TOOLCHAIN_FIELDS, ToolchainPins
from registry.errors import UsageError
from registry.gpus import GpuSpec


@dataclass(frozen=True, slots=True)
class Toolchain:
    gpu: str | None = None
    sm: int | None = None
    driver: str | None = None
    cuda: str | None = None
    tensorrt: str | None = None
    trtllm: str | None = None
    modelopt: str | None = None
    torch: str | None = None
    transformers: str | None = None
    vllm: str | None = None
    image: str | None = None

    def as_dict(self) -> dict[str, str | int | None]:
        return {name: getattr(self, name) for name in FIELDS}

    def pinned(self, pins: ToolchainPins) -> Toolchain:
        overrides = {k: v for k, v in pins.model_dump(exclude={"rebuild_on"}).items() if v}
        return replace(self, **overrides)

    def on(self, gpu: GpuSpec) -> Toolchain:
        return replace(self, gpu=gpu.sku, sm=gpu.sm)


FIELDS: Final = tuple(f.name for f in fields(Toolchain))


def from_dict(values: Mapping[str, Any]) -> Toolchain:
    """A Toolchain from `as_dict()`'s output (unknown names are ignored)."""
    return Toolchain(**{name: values.get(name) for name in FIELDS})


@dataclass(frozen=True)
class PoolToolchains:
    """The fingerprint each target's stages are keyed with, by the GPU SKU of the target:
    the pool that runs a target's GPU stages has its own fingerprint (*by_gpu*); every other
    target, and a local build, uses *default*."""

    default: Toolchain
    by_gpu: Mapping[str, Toolchain] = field(default_factory=dict)

    def for_gpu(self, sku: str) -> Toolchain:
        return self.by_gpu.get(sku, self.default)

    def pinned(self, pins: ToolchainPins) -> PoolToolchains:
        return PoolToolchains(self.default.pinned(pins),
                              {sku: tc.pinned(pins) for sku, tc in self.by_gpu.items()})

    def as_dict(self) -> dict[str, Any]:
        return {"default": self.default.as_dict(),
                "pools": {sku: tc.as_dict() for sku, tc in sorted(self.by_gpu.items())}}

# What the TensorRT-LLM 1.2.1 release image ships (see Dockerfile.builder). The driver is the
# host's, so it stays unknown until a pool is probed or the recipe pins it.
BUILDER_IMAGE: Final = Toolchain(
    cuda="13.1",
    tensorrt="10.14.1",
    trtllm="1.2.1",
    modelopt="0.37.0",
    torch="2.9.1",
    transformers="4.57.3",
    vllm="0.32.0",
)

# The fingerprint fields each stage's key may take (DESIGN §3).
STAGE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "snapshot": (),
    "quantize": ("modelopt", "torch", "transformers"),
    "convert": ("trtllm",),
    "build:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "build:trtllm-pytorch": ("trtllm",),
    "build:vllm": ("vllm",),
    "smoke:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "smoke:trtllm-pytorch": ("gpu", "sm", "driver", "cuda", "trtllm", "image"),
    "smoke:vllm": ("gpu", "sm", "driver", "cuda", "vllm"),
}
REBUILD_FIELDS: Final = TOOLCHAIN_FIELDS


def key_toolchain(
    toolchain: Toolchain, stage: str, rebuild_on: tuple[str, ...] | list[str] = REBUILD_FIELDS
) -> dict[str, str | int | None]:
    """The part of *toolchain* that goes into a key of *stage* under the rebuild policy.

    GPU SKU and SM always count where a stage depends on them: an engine never moves GPUs.
    """
    values = toolchain.as_dict()
    return {
        name: values[name]
        for name in STAGE_FIELDS[stage]
        if name in ("gpu", "sm") or name in rebuild_on
    }


PACKAGES: Final = {
    "tensorrt": "tensorrt", "trtllm": "tensorrt_llm", "modelopt": "nvidia-modelopt",
    "torch": "torch", "transformers": "transformers", "vllm": "vllm",
}
_VERSIONS_SCRIPT: Final = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try: out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError: out[name] = None\n"
    "print(json.dumps(out))\n"
)


def _package_versions(python: str) -> dict[str, str | None]:
    import json
    import sys

    from pipeline.executors.runner import capture

    if python == sys.executable:  # the default: ask this interpreter, no subprocess
        from importlib import metadata

        found_here: dict[str, str | None] = {}
        for part, dist in PACKAGES.items():
            try:
                found_here[part] = metadata.version(dist).split("+")[0]
            except metadata.PackageNotFoundError:
                found_here[part] = None
        return found_here
    done = capture([python, "-c", _VERSIONS_SCRIPT, *PACKAGES.values()], timeout_s=60)
    if not done.ok:
        return dict.fromkeys(PACKAGES)
    try:
        found: dict[str, str | None] = json.loads(done.stdout)
    except ValueError:
        return dict.fromkeys(PACKAGES)
    # local build tags (2.13.0+cpu) do not change what a stage produces
    return {part: (found.get(dist) or "").split("+")[0] or None for part, dist in PACKAGES.items()}


def _nvidia_smi() -> tuple[str | None, str | None, str | None, int]:
    """(GPU name, driver, CUDA version, count) from nvidia-smi, or Nones without a GPU."""
    import re
    import shutil

    from pipeline.executors.runner import capture

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, None, None, 0
    done = capture([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                   timeout_s=30)
    if not done.ok:
        return None, None, None, 0
    query, banner = done.stdout, capture([smi], timeout_s=30).stdout
    rows = [line.split(",") for line in query.splitlines() if line.strip()]
    if not rows:
        return None, None, None, 0
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return rows[0][0].strip(), rows[0][1].strip(), cuda.group(1) if cuda else None, len(rows)


def local_gpu() -> tuple[GpuSpec, int]:
    """This machine's GPU (through the catalog) and how many it has, from nvidia-smi, for
    `--gpu auto`; UsageError (naming --gpu SKU as the way out) when it cannot say."""
    import shutil

    from pipeline.executors.runner import capture
    from registry.gpus import UnknownGpuError, lookup_gpu

    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise UsageError("--gpu auto reads nvidia-smi, which is not on this machine; "
                         "pass --gpu SKU (e.g. --gpu h100)")
    done = capture([smi, "--query-gpu=name", "--format=csv,noheader"], timeout_s=30)
    if not done.ok:
        why = ("no answer in 30 s" if done.timed_out else
               f"exit {done.returncode}: {' '.join(done.stderr.split())[-200:]}")
        raise UsageError(f"nvidia-smi failed ({why}); pass --gpu SKU")
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if not names:
        raise UsageError("nvidia-smi lists no GPU; pass --gpu SKU")
    try:
        return lookup_gpu(names[0]), len(names)
    except UnknownGpuError as exc:
        raise UsageError(f"nvidia-smi reports {names[0]!r}, which the catalog lacks") from exc


@dataclass(frozen=True, slots=True)
class Probe:
    toolchain: Toolchain
    gpu_name: str | None  # what nvidia-smi printed
    gpu_count: int
    note: str | None  # e.g. "no NVIDIA GPU on this machine"


def probe(python: str, image: str | None = None) -> Probe:
    """This machine's fingerprint: GPU (through the catalog), driver, CUDA, and the versions
    of TensorRT, TRT-LLM, modelopt, torch, transformers and vLLM in *python*."""
    from registry.gpus import UnknownGpuError, lookup_gpu

    name, driver, cuda, count = _nvidia_smi()
    versions = _package_versions(python)
    gpu = sm = None
    note = None
    if name is None:
        note = "no NVIDIA GPU on this machine (nvidia-smi not found or lists none)"
    else:
        try:
            spec = lookup_gpu(name)
            gpu, sm = spec.sku, spec.sm
        except UnknownGpuError:
            note = f"GPU {name!r} is not in the catalog"
    return Probe(
        Toolchain(gpu=gpu, sm=sm, driver=driver, cuda=cuda, image=image, **versions),
        name, count, note,
    )


def local_pool() -> str:
    """The pool name of this machine, for the local executor."""
    import socket

    return f"host:{socket.gethostname()}"


def for_plan(recorded: Toolchain, pins: ToolchainPins) -> tuple[Toolchain, str | None]:
    """What `plan` keys with when *recorded* is a pool's last probe: what `for_build` would
    give there, and a note instead of the error a build would raise for a contradicted pin."""
    try:
        return for_build(recorded, pins), None
    except UsageError as exc:
        found: dict[str, Any] = {k: v for k, v in recorded.as_dict().items()
                                 if v is not None and k not in ("gpu", "sm")}
        return replace(BUILDER_IMAGE, **found).pinned(pins), f"a build there would refuse: {exc}"


def for_build(probed: Toolchain, pins: ToolchainPins) -> Toolchain:
    """The toolchain a build on this machine keys its stages with: what is installed here,
    over the builder image's versions. A recipe pin that this machine contradicts is an
    error: an artifact must never be keyed with a toolchain it was not built with."""
    found: dict[str, Any] = {
        k: v for k, v in probed.as_dict().items() if v is not None and k not in ("gpu", "sm")
    }
    for name, pinned in pins.model_dump(exclude={"rebuild_on"}).items():
        if pinned and found.get(name) not in (None, pinned):
            raise UsageError(
                f"the recipe pins toolchain.{name} {pinned!r}, this machine has "
                f"{found[name]!r}; build where the pin holds, or change the pin"
            )
    return replace(BUILDER_IMAGE, **found).pinned(pins)
