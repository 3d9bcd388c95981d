"""A target: one point of the matrix (GPU SKU, tp, pp, quant, KV-cache dtype, shape,
runtime), and whether a matrix filter or a promotion match picks it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.recipe.fields import KvCacheDtype, Quant, Runtime
from pipeline.recipe.matrix import AxisSelection, Shape
from registry.gpus import GpuSpec

AXES = ("gpu", "tp", "pp", "quant", "kv_cache_dtype", "shape", "runtime")


@dataclass(frozen=True, slots=True)
class Target:
    gpu: GpuSpec
    tp: int
    pp: int
    quant: Quant
    kv_cache_dtype: KvCacheDtype
    shape: Shape
    runtime: Runtime

    @property
    def id(self) -> str:
        return (
            f"{self.gpu.sku}/tp{self.tp}/pp{self.pp}/{self.quant}/kv-{self.kv_cache_dtype}/"
            f"{self.shape.label}/{self.runtime}"
        )

    def axis(self, name: str) -> Any:
        if name == "gpu":
            return self.gpu.sku
        if name == "shape":
            return self.shape.label
        return getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "gpu": self.gpu.sku,
            "sm": self.gpu.sm,
            "tp": self.tp,
            "pp": self.pp,
            "quant": self.quant,
            "kv_cache_dtype": self.kv_cache_dtype,
            "shape": self.shape.model_dump(),
            "runtime": self.runtime,
        }


def selects(target: Target, entry: AxisSelection) -> bool:
    """Whether *entry* (a matrix filter or a promotion match) picks *target*."""
    for name in AXES:
        wanted = getattr(entry, name)
        if wanted is not None and target.axis(name) not in wanted:
            return False
    return True
