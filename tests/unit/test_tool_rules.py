"""What the real tools refuse is refused by plan: vLLM 0.32's scheduler budget rule and the
families TensorRT-LLM's convert scripts can split (pipeline.planning.tool_rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import PlanError
from pipeline.planning.target import Target
from pipeline.planning.tool_rules import VLLM_CHUNKED_PREFILL, check_vllm_scheduler
from pipeline.recipe.matrix import Shape
from pipeline.stages.convert import unconvertible
from registry.gpus import lookup_gpu

PATH = Path("recipe.yaml")


def vllm_target(batch: int, seq: int, tokens: int | None) -> Target:
    shape = Shape(name="s", max_batch_size=batch, max_input_len=min(seq, 64), max_seq_len=seq,
                  max_num_tokens=tokens)
    return Target(lookup_gpu("h100"), 1, 1, "bf16", "auto", shape, "vllm")


def test_vllm_032_runs_our_targets_with_chunked_prefill() -> None:
    assert VLLM_CHUNKED_PREFILL is True


@pytest.mark.parametrize("chunked", [True, False])
def test_batched_tokens_below_max_num_seqs_is_refused(chunked: bool) -> None:
    with pytest.raises(PlanError, match=r"shape.max_num_tokens 64 < max_batch_size 128"):
        check_vllm_scheduler(PATH, vllm_target(128, 4096, 64), chunked_prefill=chunked)


def test_batched_tokens_below_max_model_len_only_matter_without_chunked_prefill() -> None:
    target = vllm_target(32, 4096, 2048)
    check_vllm_scheduler(PATH, target, chunked_prefill=True)
    with pytest.raises(PlanError, match=r"max_num_tokens 2048 < max_seq_len 4096") as found:
        check_vllm_scheduler(PATH, target, chunked_prefill=False)
    assert str(found.value).startswith(f"recipe.yaml: target {target.id}: ")


def test_no_budget_and_a_sufficient_one_pass() -> None:
    check_vllm_scheduler(PATH, vllm_target(256, 4096, None), chunked_prefill=False)
    check_vllm_scheduler(PATH, vllm_target(256, 4096, 256), chunked_prefill=True)


@pytest.mark.parametrize(("family", "pp", "refused"), [
    ("llama", 2, False), ("mistral", 4, False), ("qwen3", 2, False),
    ("gemma2", 1, False), ("gemma3", 2, True), ("phi3", 2, True), ("phi3", 1, False),
    ("falcon", 1, True), ("deepseekv3", 1, True),
])
def test_which_families_convert(family: str, pp: int, refused: bool) -> None:
    assert (unconvertible(family, pp) is not None) is refused
