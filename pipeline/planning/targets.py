"""Targets: the matrix expanded (minus `exclude`, plus `include`) and checked.

Every check here is pure and runs before anything is built: a 30-minute build must not be
the way a user learns that FP8 needs an Ada or Hopper GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import PlanError, RecipeError
from pipeline.planning.memory import Fit, memory_fit
from pipeline.planning.target import Target, selects
from pipeline.planning.tool_rules import check_tool_rules
from pipeline.recipe.fields import Runtime
from pipeline.recipe.matrix import Matrix, MatrixFilter
from pipeline.recipe.model import Architecture
from pipeline.recipe.reader import LoadedRecipe
from pipeline.recipe.schema import BuildSettings
from registry.gpus import KV_SM, QUANT_SM, lookup_gpu

# What each runtime can serve, as (quantizations, KV-cache dtypes).
RUNTIME_QUANTS: dict[str, frozenset[str]] = {
    "trtllm": frozenset(QUANT_SM),
    "trtllm-pytorch": frozenset({"bf16", "fp16", "fp8", "int4_awq", "w4a8_awq", "nvfp4"}),
    "vllm": frozenset({"bf16", "fp16", "fp8", "nvfp4"}),
}
RUNTIME_KV: dict[str, frozenset[str]] = {
    "trtllm": frozenset({"auto", "fp8", "int8"}),
    "trtllm-pytorch": frozenset({"auto", "fp8"}),
    "vllm": frozenset({"auto", "fp8"}),
}


def _product(matrix: Matrix, runtimes: list[Runtime], entry: MatrixFilter | None) -> list[Target]:
    shapes = {s.label: s for s in matrix.shape}

    def pick(name: str, default: list[Any]) -> list[Any]:
        chosen = getattr(entry, name) if entry is not None else None
        return default if chosen is None else chosen

    shape_labels = pick("shape", list(shapes))
    return [
        Target(lookup_gpu(g), tp, pp, q, kv, shapes[s], r)
        for g, tp, pp, q, kv, s, r in itertools.product(
            pick("gpu", matrix.gpu),
            pick("tp", matrix.tp),
            pick("pp", matrix.pp),
            pick("quant", matrix.quant),
            pick("kv_cache_dtype", matrix.kv_cache_dtype),
            shape_labels,
            pick("runtime", runtimes),
        )
    ]


def expand_matrix(loaded: LoadedRecipe) -> list[Target]:
    """The matrix product minus `exclude`, plus `include`, in recipe order."""
    recipe, path = loaded.recipe, loaded.path
    matrix, runtimes = recipe.matrix, recipe.serve.runtimes
    shape_names = {s.label for s in matrix.shape}
    shapes = ", ".join(sorted(shape_names))
    # what an entry may name on the axes the recipe itself defines, and what else is said
    known: dict[str, tuple[set[str], Callable[[str], str]]] = {
        "shape": (shape_names, lambda name: f"no shape named {name!r} (shapes: {shapes})"),
        "runtime": (set(runtimes),
                    lambda runtime: f"runtime {runtime!r} has no 'serve.{runtime}' section"),
    }
    for section in ("exclude", "include"):
        for index, entry in enumerate(getattr(matrix, section)):
            for axis, (allowed, unknown) in known.items():
                for value in getattr(entry, axis) or []:
                    if value not in allowed:
                        raise RecipeError(
                            path, unknown(value), field=f"matrix.{section}[{index}].{axis}",
                            line=loaded.line_of("matrix", section, index, axis),
                        )

    everything = _product(matrix, runtimes, None)
    targets = everything
    for index, entry in enumerate(matrix.exclude):
        if not any(selects(t, entry) for t in everything):
            raise RecipeError(
                path,
                "matches no target of the matrix (a typo, or a leftover?)",
                field=f"matrix.exclude[{index}]",
                line=loaded.line_of("matrix", "exclude", index),
            )
        targets = [t for t in targets if not selects(t, entry)]
    seen = {t.id for t in targets}
    for index, entry in enumerate(matrix.include):
        for target in _product(matrix, runtimes, entry):
            if target.id in seen:
                raise RecipeError(
                    path,
                    f"adds {target.id}, which the matrix already has (duplicate target)",
                    field=f"matrix.include[{index}]",
                    line=loaded.line_of("matrix", "include", index),
                )
            seen.add(target.id)
            targets.append(target)
    if not targets:
        raise RecipeError(
            path,
            "every target is excluded; nothing to plan",
            field="matrix",
            line=loaded.line_of("matrix"),
        )
    return targets


def check_target(
    path: Path, target: Target, arch: Architecture, dtype: str, awq_block_size: int = 128
) -> Fit:
    """Fail fast on what cannot work; return the memory fit of what can."""
    _check_support(path, target)
    _check_shape(path, target, arch)
    _check_awq_groups(path, target, arch, awq_block_size)
    return _check_memory(path, target, arch, dtype)


def _check_awq_groups(path: Path, target: Target, arch: Architecture, block: int) -> None:
    """AWQ quantizes in groups of `awq_block_size` input features, per rank: a row-parallel
    layer (o_proj, down_proj) split over tp must keep whole groups. modelopt only finds out
    after calibrating."""
    if target.quant not in ("int4_awq", "w4a8_awq"):
        return
    ranks = target.tp if target.runtime == "trtllm" else 1  # HF exports are not split
    layers = {
        "o_proj": arch.num_attention_heads * arch.resolved_head_dim // ranks,
        "down_proj": arch.intermediate_size // ranks,
        "q/k/v/gate/up_proj": arch.hidden_size,
    }
    for name, features in layers.items():
        if features % block:
            raise PlanError(
                path,
                target.id,
                f"quantize.awq_block_size {block} does not divide the {features} input "
                f"features of {name} per rank at tp {ranks}",
                "use awq_block_size 64, a smaller tp, or exclude this target",
            )


def _check_support(path: Path, target: Target) -> None:
    """The GPU and the runtime can run this quantization and KV-cache dtype."""
    gpu, quant, kv = target.gpu, target.quant, target.kv_cache_dtype
    if gpu.is_cpu and (target.runtime != "vllm" or quant not in ("bf16", "fp16") or kv != "auto"):
        raise PlanError(
            path,
            target.id,
            f"the CPU serves only vllm with bf16/fp16 and kv auto, not {target.runtime} {quant} "
            f"kv {kv}",
            "exclude it, or pick a GPU",
        )
    low, high = QUANT_SM[quant]
    if gpu.is_cpu:
        low = 0
    if gpu.sm < low or (high is not None and gpu.sm > high):
        span = f"SM {low}" + (f"-{high}" if high else "+")
        raise PlanError(
            path,
            target.id,
            f"{quant} needs {span}, {gpu.sku} is SM {gpu.sm}",
            f"add {{gpu: {gpu.sku}, quant: {quant}}} to matrix.exclude or pick another GPU",
        )
    if gpu.sm < KV_SM[kv]:
        raise PlanError(
            path,
            target.id,
            f"an {kv} KV cache needs SM {KV_SM[kv]}+, {gpu.sku} is SM {gpu.sm}",
            "use kv_cache_dtype auto or int8 for this GPU",
        )
    for axis, value, served, refusal in (
            ("quant", quant, RUNTIME_QUANTS, f"cannot serve {quant}"),
            ("kv_cache_dtype", kv, RUNTIME_KV, f"has no {kv} KV cache")):
        if value not in served[target.runtime]:
            raise PlanError(
                path, target.id, f"{target.runtime} {refusal}",
                f"add {{runtime: {target.runtime}, {axis}: {value}}} to matrix.exclude",
            )


def _check_shape(path: Path, target: Target, arch: Architecture) -> None:
    """The shape and parallelism suit the model."""
    if target.shape.max_num_tokens is not None and (
        target.shape.max_num_tokens < target.shape.max_input_len
    ):
        raise PlanError(
            path,
            target.id,
            f"max_num_tokens {target.shape.max_num_tokens} < max_input_len "
            f"{target.shape.max_input_len} cannot schedule one full prompt",
            "raise max_num_tokens to at least max_input_len",
        )
    if arch.num_attention_heads % target.tp:
        raise PlanError(
            path,
            target.id,
            f"tp {target.tp} does not divide {arch.num_attention_heads} attention heads",
            "pick a tp that divides the head count",
        )
    if arch.num_layers < target.pp:
        raise PlanError(
            path, target.id, f"pp {target.pp} exceeds {arch.num_layers} layers", "lower pp"
        )
    if arch.max_position_embeddings and target.shape.max_seq_len > arch.max_position_embeddings:
        raise PlanError(
            path,
            target.id,
            f"max_seq_len {target.shape.max_seq_len} exceeds the model's "
            f"max_position_embeddings {arch.max_position_embeddings}",
            "lower max_seq_len",
        )


def _check_memory(path: Path, target: Target, arch: Architecture, dtype: str) -> Fit:
    fit = _fit(arch, target, dtype, target.tp)
    if not fit.fits:
        if fit.max_batch_size > 0:
            fix = (
                f"max_batch_size {fit.max_batch_size} fits at max_seq_len "
                f"{target.shape.max_seq_len}; lower it, raise tp, or exclude this target"
            )
        else:
            fix = _what_fits(arch, target, dtype)
        raise PlanError(
            path,
            target.id,
            f"does not fit: needs {fit.summary()}",
            fix,
        )
    return fit


def _fit(arch: Architecture, target: Target, dtype: str, tp: int) -> Fit:
    """The memory fit of *target* at *tp*."""
    return memory_fit(
        arch, target.gpu, dtype="float16" if dtype == "float16" else "bfloat16",
        quant=target.quant, kv_cache_dtype=target.kv_cache_dtype, tp=tp, pp=target.pp,
        max_batch_size=target.shape.max_batch_size, max_seq_len=target.shape.max_seq_len,
    )


def _what_fits(arch: Architecture, target: Target, dtype: str) -> str:
    for tp in (2, 4, 8, 16):
        if tp <= target.tp or arch.num_attention_heads % tp:
            continue
        fit = _fit(arch, target, dtype, tp)
        if fit.fits:
            return f"the weights alone do not fit; tp {tp} fits, or exclude this target"
    return "the weights alone do not fit; use more GPUs, a smaller quantization, or exclude it"


# PluginConfig.tokens_per_block's default (tensorrt_llm/plugin/plugin.py); enginectl does not
# set it.
TRTLLM_TOKENS_PER_BLOCK = 32


def check_engine_shape(path: Path, target: Target, build: BuildSettings) -> None:
    """An engine's shape that trtllm-build would silently change (tensorrt_llm/_common.py
    check_max_num_tokens): the engine would not be the target's, and the build stage would
    refuse it after the build. Said here instead, before anything runs."""
    tokens = target.shape.max_num_tokens
    if target.runtime != "trtllm" or tokens is None:
        return
    if build.remove_input_padding == "disable":
        raise PlanError(
            path, target.id,
            f"max_num_tokens {tokens} is ignored with build.remove_input_padding disable "
            "(TRT-LLM builds max_batch_size × max_seq_len)",
            "drop max_num_tokens from the shape or enable remove_input_padding",
        )
    if tokens < TRTLLM_TOKENS_PER_BLOCK:
        raise PlanError(
            path, target.id,
            f"max_num_tokens {tokens} is below one KV-cache block; TRT-LLM raises it to "
            f"{TRTLLM_TOKENS_PER_BLOCK}",
            f"set max_num_tokens to at least {TRTLLM_TOKENS_PER_BLOCK}",
        )


def plan_targets(loaded: LoadedRecipe, arch: Architecture) -> list[tuple[Target, Fit]]:
    planned = []
    for target in expand_matrix(loaded):
        fit = check_target(loaded.path, target, arch, loaded.recipe.model.dtype,
                           loaded.recipe.quantize.awq_block_size)
        check_engine_shape(loaded.path, target, loaded.recipe.build)
        check_tool_rules(loaded.path, target, arch)
        planned.append((target, fit))
    return planned
