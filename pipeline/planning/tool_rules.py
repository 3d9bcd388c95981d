"""What the real tools refuse, said at plan time: a target that TensorRT-LLM's convert script
or vLLM's engine would reject after a snapshot (or a night of queueing) is refused by `plan`,
in one line naming the target, the field and its value.

Pure: facts about the tools are constants here, each with the source it was read from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pipeline.errors import PlanError
from pipeline.planning.target import Target
from pipeline.recipe.model import Architecture
from pipeline.stages.convert import FAMILY_DIRS, unconvertible
from pipeline.stages.quantize import needs_quantize

# vLLM 0.32 turns chunked prefill on by default for every decoder-only generative model, on
# CUDA and on the CPU alike: EngineArgs._set_default_chunked_prefill_and_prefix_caching_args
# (vllm/engine/arg_utils.py) takes ModelConfig.is_chunked_prefill_supported
# (vllm/config/model.py: True unless encoder-decoder or a pooling model). The CPU platform
# turns it off only on RISC-V and for MLA models (vllm/platforms/cpu.py
# check_and_update_config), and then raises max_num_batched_tokens to max_model_len itself.
# enginectl passes no --enable-chunked-prefill, so its vLLM targets run with it on.
VLLM_CHUNKED_PREFILL: Final = True


def check_tool_rules(path: Path, target: Target, arch: Architecture) -> None:
    """Raise PlanError for a target the real tool would refuse."""
    if target.runtime == "trtllm" and not needs_quantize(target.quant, target.kv_cache_dtype):
        _check_convert(path, target, arch)
    if target.runtime == "vllm":
        check_vllm_scheduler(path, target, chunked_prefill=VLLM_CHUNKED_PREFILL)


def _check_convert(path: Path, target: Target, arch: Architecture) -> None:
    why = unconvertible(arch.family, target.pp)
    if why is None:
        return
    if arch.family in FAMILY_DIRS:  # a pp the script cannot split
        raise PlanError(path, target.id, f"pp {target.pp}: {why}",
                        "use pp 1 with a larger tp, or exclude this target")
    raise PlanError(path, target.id, f"model.architecture.family {arch.family!r}: {why}",
                    "serve it with runtime trtllm-pytorch or vllm, or exclude this target")


def check_vllm_scheduler(path: Path, target: Target, *, chunked_prefill: bool) -> None:
    """vLLM 0.32's SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py), run when
    the engine starts: max_num_batched_tokens (the shape's max_num_tokens) must be at least
    max_num_seqs (max_batch_size), and at least max_model_len (max_seq_len) when chunked
    prefill is off. Without max_num_tokens vLLM picks a budget that satisfies both."""
    shape = target.shape
    tokens = shape.max_num_tokens
    if tokens is None:
        return
    if tokens < shape.max_batch_size:
        raise PlanError(
            path, target.id,
            f"shape.max_num_tokens {tokens} < max_batch_size {shape.max_batch_size}: vLLM "
            "refuses max_num_batched_tokens below max_num_seqs",
            f"raise max_num_tokens to at least {shape.max_batch_size}",
        )
    if not chunked_prefill and tokens < shape.max_seq_len:
        raise PlanError(
            path, target.id,
            f"shape.max_num_tokens {tokens} < max_seq_len {shape.max_seq_len}: vLLM without "
            "chunked prefill refuses max_num_batched_tokens below max_model_len",
            f"raise max_num_tokens to at least {shape.max_seq_len}",
        )
