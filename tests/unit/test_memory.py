"""Memory fit per tp rank, on the numbers everyone knows."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.planning.memory import GIB, Fit, memory_fit, parameter_counts
from pipeline.recipe.model import Architecture
from registry.gpus import lookup_gpu

LLAMA_70B = Architecture(
    num_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
    num_key_value_heads=8, vocab_size=128256, head_dim=128,
)
H100 = lookup_gpu("h100")


def fit(quant: Any, tp: int, batch: int, seq: int = 4096, kv: Any = "fp8") -> Fit:
    return memory_fit(
        LLAMA_70B, H100, dtype="bfloat16", quant=quant, kv_cache_dtype=kv,
        tp=tp, pp=1, max_batch_size=batch, max_seq_len=seq,
    )


def test_seventy_b_has_seventy_billion_parameters() -> None:
    layers, rest = parameter_counts(LLAMA_70B)
    assert 70.0e9 < layers + rest < 71.0e9


def test_bf16_seventy_b_does_not_fit_one_h100() -> None:
    result = fit("bf16", tp=1, batch=1, kv="auto")
    assert not result.fits
    assert result.max_batch_size == 0


def test_fp8_seventy_b_fits_one_h100_with_a_small_batch_only() -> None:
    small = fit("fp8", tp=1, batch=4)
    assert small.fits
    assert not fit("fp8", tp=1, batch=128).fits


@pytest.mark.parametrize(("quant", "tp"), [("fp8", 1), ("fp8", 8), ("int4_awq", 1), ("bf16", 8)])
def test_the_largest_batch_it_reports_is_exactly_the_boundary(quant: str, tp: int) -> None:
    largest = fit(quant, tp=tp, batch=1).max_batch_size
    assert largest > 0
    assert fit(quant, tp=tp, batch=largest).fits
    assert not fit(quant, tp=tp, batch=largest + 1).fits


def test_tp_splits_weights_and_kv_heads() -> None:
    one, eight = fit("fp8", tp=1, batch=8), fit("fp8", tp=8, batch=8)
    assert one.weights_bytes / eight.weights_bytes == pytest.approx(8, rel=0.01)
    assert one.kv_bytes == 8 * eight.kv_bytes
    assert eight.weights_bytes < 9 * GIB
