"""Toolchain fingerprints, and which parts of one each stage's key depends on.

At plan time the fingerprint of a GPU pool comes from the recipe's `toolchain` pins over the
builder image's own versions (`BUILDER_IMAGE`); a nightly probe replaces the defaults with
what the pool really runs. `rebuild_on` is the policy: which fields force a rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Final

from pipeline.recipe import TOOLCHAIN_FIELDS, ToolchainPins
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
