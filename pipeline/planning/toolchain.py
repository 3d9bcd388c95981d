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
from typing import TYPE_CHECKING, Any, Final

from pipeline.recipe.toolchain_fields import TOOLCHAIN_FIELDS
from registry.errors import UsageError
from registry.gpus import GpuSpec

if TYPE_CHECKING:

    from pipeline.recipe.schema import ToolchainPins


@dataclass(frozen=True, slots=True)
class Toolchain:
    gpu: str | None = None
    sm: int | None = None
    driver: str | None = None
    driver_cuda: str | None = None  # the newest CUDA the driver runs (nvidia-smi's banner)
    cuda: str | None = None  # the CUDA toolkit TRT-LLM and torch were built with (the image's)
    tensorrt: str | None = None
    trtllm: str | None = None
    modelopt: str | None = None
    torch: str | None = None
    transformers: str | None = None
    vllm: str | None = None  # as vLLM's own Python has it, local version (+cu128) kept
    vllm_torch: str | None = None  # the torch in vLLM's Python
    vllm_cuda: str | None = None  # torch.version.cuda in vLLM's Python (None: a CPU build)
    vllm_triton: str | None = None  # the Triton in vLLM's Python
    image: str | None = None

    def as_dict(self) -> dict[str, str | int | None]:
        return {name: getattr(self, name) for name in FIELDS}

    def pinned(self, pins: ToolchainPins) -> Toolchain:
        """This toolchain with the recipe's *pins* over it; a vLLM pin without a local version
        (`0.11.0`) keeps the local version found (`0.11.0+cu128`), which the key needs."""
        overrides = {k: v for k, v in pins.model_dump(exclude={"rebuild_on"}).items()
                     if v and not (k == "vllm" and _same_public(self.vllm, v))}
        return replace(self, **overrides)

    def on(self, gpu: GpuSpec) -> Toolchain:
        return replace(self, gpu=gpu.sku, sm=gpu.sm)


FIELDS: Final = tuple(f.name for f in fields(Toolchain))


def _same_public(found: str | None, pinned: str | None) -> bool:
    """Whether *found* is *pinned* with a local version added (`0.11.0+cu128`, `0.11.0`)."""
    return bool(found and pinned and "+" not in pinned and found.partition("+")[0] == pinned)


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

# What the TensorRT-LLM 1.2.1 release image ships (see Dockerfile.builder), in the form the
# probe reads it there (pipeline.planning.versions). The image is built FROM
# nvcr.io/nvidia/pytorch:25.12
# (TRT-LLM docker/common/install_tensorrt.sh of the 1.2 era, stored version id 46236905056:
# TRT_VER 10.14.1.48, CUDA_VER 13.1 "align with ... rel-25-12"), whose torch is
# 2.10.0a0+b4e4ee81d3 built with CUDA 13.1 (NGC PyTorch 25.12 release notes); TRT-LLM 1.2.1's
# requirements.txt bounds torch <=2.10.0a0 to take it. The driver (and the CUDA it runs) is
# the host's, and vLLM is not in this image (the vLLM environment is probed where it serves):
# they stay unknown until a pool is probed or the recipe pins them.
BUILDER_IMAGE: Final = Toolchain(
    cuda="13.1",
    tensorrt="10.14.1.48",
    trtllm="1.2.1",
    modelopt="0.37.0",
    torch="2.10.0a0+b4e4ee81d3",
    transformers="4.57.3",
)

# The fingerprint fields each stage's key may take (DESIGN §3). `driver_cuda` is in none: the
# driver version is in every key that depends on the driver, and the CUDA a driver runs is a
# function of its version (its branch), so the field would never change a key on its own.
STAGE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "snapshot": (),
    "quantize": ("modelopt", "torch", "transformers"),
    "convert": ("trtllm",),
    "build:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "build:trtllm-pytorch": ("trtllm",),
    "build:vllm": ("vllm", "vllm_torch", "vllm_cuda", "vllm_triton"),
    "smoke:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "smoke:trtllm-pytorch": ("gpu", "sm", "driver", "cuda", "trtllm", "image"),
    "smoke:vllm": ("gpu", "sm", "driver", "vllm", "vllm_torch", "vllm_cuda", "vllm_triton"),
}
REBUILD_FIELDS: Final = TOOLCHAIN_FIELDS
# vLLM's stages are keyed with what vLLM's own Python has (its torch, that torch's CUDA, its
# Triton: `probe`), never the builder's `torch` and `cuda`; a recipe's `rebuild_on` names
# them all as `vllm`.
_COUNTED_AS: Final = {"vllm_torch": "vllm", "vllm_cuda": "vllm", "vllm_triton": "vllm"}


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
        if name in ("gpu", "sm") or _COUNTED_AS.get(name, name) in rebuild_on
    }


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
        if name == "vllm" and _same_public(found.get(name), pinned):
            continue
        if pinned and found.get(name) not in (None, pinned):
            raise UsageError(
                f"the recipe pins toolchain.{name} {pinned!r}, this machine has "
                f"{found[name]!r}; build where the pin holds, or change the pin"
            )
    return replace(BUILDER_IMAGE, **found).pinned(pins)
