"""Does a target fit? Weights plus KV cache per tp rank, against the GPU's memory.

The estimate, stated so users can check it:

- weights: every transformer-layer matrix at the quantized width (with its scales), the
  embedding and lm_head at the model dtype (modelopt leaves them unquantized), all split
  evenly over tp × pp ranks;
- KV cache: 2 (K and V) × layers/pp × max(1, kv_heads/tp) × head_dim × KV bytes, for
  max_batch_size × max_seq_len tokens;
- margin: 5% of the GPU's memory plus 2 GiB, for the CUDA context, activations and workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.recipe.fields import KvCacheDtype, ModelDtype, Quant
from pipeline.recipe.model import Architecture
from registry.gpus import GpuSpec

GIB: Final = 1 << 30
MARGIN_FRACTION: Final = 0.05
MARGIN_FIXED_BYTES: Final = 2 * GIB

# Bytes per quantized weight, scales included: INT4 with a 16-bit scale per group of 128,
# NVFP4 with an FP8 scale per block of 16.
WEIGHT_BYTES: Final[dict[str, float]] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8_sq": 1.0,
    "int4_awq": 0.5 + 2 / 128,
    "w4a8_awq": 0.5 + 2 / 128,
    "nvfp4": 0.5 + 1 / 16,
}
KV_BYTES: Final[dict[str, int]] = {"auto": 2, "fp8": 1, "int8": 1}


def parameter_counts(arch: Architecture) -> tuple[int, int]:
    """(parameters in transformer layers, parameters in embedding + lm_head + final norm)."""
    head_dim = arch.resolved_head_dim
    q_out = arch.num_attention_heads * head_dim
    kv_out = arch.num_key_value_heads * head_dim
    attention = arch.hidden_size * (q_out + 2 * kv_out) + q_out * arch.hidden_size
    mlp = 3 * arch.hidden_size * arch.intermediate_size
    norms = 2 * arch.hidden_size
    layers = arch.num_layers * (attention + mlp + norms)
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return layers, embeddings + arch.hidden_size


@dataclass(frozen=True, slots=True)
class Fit:
    weights_bytes: int
    kv_bytes: int
    margin_bytes: int
    capacity_bytes: int
    max_batch_size: int  # largest batch that fits at this max_seq_len (0: weights alone do not)

    @property
    def needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.margin_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.capacity_bytes

    def summary(self) -> str:
        return (
            f"{self.needed_bytes / GIB:.1f}/{self.capacity_bytes / GIB:.1f} GiB per rank "
            f"(weights {self.weights_bytes / GIB:.1f}, KV {self.kv_bytes / GIB:.1f}, "
            f"margin {self.margin_bytes / GIB:.1f})"
        )


def weights_per_rank(arch: Architecture, dtype: ModelDtype, quant: Quant, ranks: int) -> int:
    del dtype  # both model dtypes are 2 bytes wide
    layers, rest = parameter_counts(arch)
    return int((layers * WEIGHT_BYTES[quant] + rest * 2) / ranks)


def kv_bytes_per_token(arch: Architecture, kv: KvCacheDtype, tp: int, pp: int) -> int:
    kv_heads = max(1, arch.num_key_value_heads // tp)
    layers = -(-arch.num_layers // pp)
    return 2 * layers * kv_heads * arch.resolved_head_dim * KV_BYTES[kv]


def memory_fit(
    arch: Architecture,
    gpu: GpuSpec,
    *,
    dtype: ModelDtype,
    quant: Quant,
    kv_cache_dtype: KvCacheDtype,
    tp: int,
    pp: int,
    max_batch_size: int,
    max_seq_len: int,
) -> Fit:
    capacity = gpu.memory_mib * (1 << 20)
    margin = int(capacity * MARGIN_FRACTION) + MARGIN_FIXED_BYTES
    weights = weights_per_rank(arch, dtype, quant, tp * pp)
    per_sequence = kv_bytes_per_token(arch, kv_cache_dtype, tp, pp) * max_seq_len
    room = capacity - margin - weights
    return Fit(
        weights_bytes=weights,
        kv_bytes=per_sequence * max_batch_size,
        margin_bytes=margin,
        capacity_bytes=capacity,
        max_batch_size=max(0, room // per_sequence) if per_sequence else 0,
    )


def calibration_gpus(arch: Architecture, dtype: ModelDtype, gpu: GpuSpec) -> int:
    """How many of *gpu*'s GPUs quantization needs on one node: enough to hold the model at
    its own dtype (modelopt calibrates the unquantized model, spread with device_map="auto"),
    with the same margin as a target; a power of two, 0 on the CPU."""
    if gpu.is_cpu:
        return 0
    capacity = gpu.memory_mib * (1 << 20)
    room = capacity - int(capacity * MARGIN_FRACTION) - MARGIN_FIXED_BYTES
    needed = weights_per_rank(arch, dtype, "bf16", 1)
    count = 1
    while count * room < needed and count < 64:
        count *= 2
    return count
