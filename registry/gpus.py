"""The GPU catalog: what each SKU is, and every name users and `nvidia-smi` call it.

Memory is what `nvidia-smi --query-gpu=memory.total` reports, in MiB: that, not the number
on the box, is what a tp rank has to fit into.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from registry.errors import UsageError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    sku: str  # canonical name, used in keys, labels and Ray resources (gpu:<sku>)
    sm: int  # compute capability as an integer: 8.0 -> 80, 9.0 -> 90
    memory_mib: int
    names: tuple[str, ...]  # other spellings, including what nvidia-smi prints

    @property
    def is_cpu(self) -> bool:
        return self.sm == 0

    @property
    def fp8(self) -> bool:
        return self.sm >= 89

    @property
    def fp4(self) -> bool:
        return self.sm >= 100

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024


CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec("A10G", 86, 23028, ("a10g", "NVIDIA A10G")),
    GpuSpec("L4", 89, 23034, ("l4", "NVIDIA L4")),
    GpuSpec("L40S", 89, 46068, ("l40s", "NVIDIA L40S")),
    GpuSpec("A100-SXM4-40GB", 80, 40960, ("a100-40gb", "NVIDIA A100-SXM4-40GB")),
    GpuSpec(
        "A100-SXM4-80GB", 80, 81920, ("a100", "a100-80gb", "a100-sxm", "NVIDIA A100-SXM4-80GB")
    ),
    GpuSpec("A100-PCIE-40GB", 80, 40960, ("a100-pcie", "NVIDIA A100-PCIE-40GB")),
    GpuSpec("A100-PCIE-80GB", 80, 81920, ("NVIDIA A100 80GB PCIe",)),
    GpuSpec(
        "H100-SXM5-80GB", 90, 81559, ("h100", "h100-sxm", "h100-80gb", "NVIDIA H100 80GB HBM3")
    ),
    GpuSpec("H100-PCIE-80GB", 90, 81559, ("h100-pcie", "NVIDIA H100 PCIe")),
    GpuSpec("H100-NVL-94GB", 90, 95830, ("h100-nvl", "NVIDIA H100 NVL")),
    GpuSpec("H200-SXM-141GB", 90, 143771, ("h200", "h200-sxm", "NVIDIA H200")),
    GpuSpec("H200-NVL-141GB", 90, 143771, ("h200-nvl", "NVIDIA H200 NVL")),
    GpuSpec("GH200-96GB", 90, 97871, ("gh200", "NVIDIA GH200 480GB")),
    GpuSpec("B200-180GB", 100, 183359, ("b200", "NVIDIA B200")),
    # Not a GPU: vLLM's CPU build, for laptops and CI. SM 0; memory is the KV-cache budget.
    GpuSpec("CPU", 0, 16384, ("cpu",)),
)


# The lowest SM (and the highest, where kernels stop) for each quantization, from
# TensorRT-LLM's hardware support matrix (docs/source/features/quantization.md) and
# ModelOpt's: AWQ and SmoothQuant kernels stop at Hopper; see README "Quantization support".
QUANT_SM: dict[str, tuple[int, int | None]] = {
    "bf16": (80, None),
    "fp16": (75, None),
    "fp8": (89, None),
    "int8_sq": (80, 90),
    "int4_awq": (80, 90),
    "w4a8_awq": (89, 90),
    "nvfp4": (100, None),
}
KV_SM: dict[str, int] = {"auto": 0, "int8": 0, "fp8": 89}



def quant_supported(quant: str, kv_cache_dtype: str, sm: int) -> bool:
    """Whether a GPU of SM *sm* has kernels for this quantization and KV-cache dtype."""
    low, high = QUANT_SM[quant]
    return low <= sm and (high is None or sm <= high) and sm >= KV_SM[kv_cache_dtype]


def _fold(name: str) -> str:
    """Spelling-insensitive form: case, spaces, dashes and underscores do not matter."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


_INDEX: dict[str, GpuSpec] = {}
for _spec in CATALOG:
    for _name in (_spec.sku, *_spec.names):
        _INDEX.setdefault(_fold(_name), _spec)


class UnknownGpuError(UsageError, LookupError):
    """A GPU name the catalog lacks: the one message for it, `unknown GPU 'x'; known: ...`,
    after the *option* it was given to (`--gpu: unknown GPU ...`) when there is one. A usage
    error (exit 2): a command that looks up a flag's value lets it through as it is."""

    def __init__(self, name: str, *, option: str | None = None) -> None:
        self.name = name
        self.option = option
        where = f"{option}: " if option else ""
        super().__init__(
            f"{where}unknown GPU {name!r}; known: {', '.join(s.sku for s in CATALOG)}")


def lookup_gpu(name: str, *, option: str | None = None) -> GpuSpec:
    """Find a GPU by any of its names: `h100`, `H100-SXM`, `NVIDIA H100 80GB HBM3`; a name
    given to a command-line *option* (`--gpu`) is named with it when it is unknown."""
    spec = _INDEX.get(_fold(name))
    if spec is None:
        raise UnknownGpuError(name, option=option)
    return spec
