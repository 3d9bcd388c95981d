"""What trtllm-build really builds is what enginectl's plan, key and labels say it builds.

TensorRT-LLM 1.2's build() changes plugin features with only a warning (INT4-AWQ with an FP8
KV cache loses paged context FMHA; W4A8-AWQ with paged context FMHA and an FP8 KV cache gains
FP8 context FMHA; reduce_fusion is dropped at tp 1). tests/fakes/trtllm_builder.py is an
independent reading of those rules from TRT-LLM's source; here every engine target of every
shipped recipe is run through it with the exact argv the plan emits and the checkpoint config
the plan's quantize or convert stage writes, and what comes out must be what the flags (the
build key's params) say, with nothing overridden.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import PlanError
from pipeline.listings import plan_lines
from pipeline.planning.plan import KIND_ENGINE, Plan
from pipeline.planning.target import Target
from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import BuildSettings
from pipeline.stages.build import ON_OFF_FEATURES, build_flags, plugin_overrides
from pipeline.stages.quantize import QFORMAT
from pipeline.stages.quantizer.options import KV_CACHE_QUANT_ALGO, QUANT_ALGO
from tests.fakes.cli_contract import parse
from tests.fakes.trtllm_builder import build_config
from tests.helpers import RECIPES, plan_of, recipe_data

SHIPPED = sorted(path.name for path in RECIPES.glob("*.yaml"))


def checkpoint_config(plan: Plan, target: Target) -> dict[str, Any]:
    """The TRT-LLM checkpoint config.json trtllm-build reads for *target*: what the quantizer
    (pipeline/stages/quantizer/, checked against modelopt's real export in tests/quantize) or the
    convert stage writes."""
    kv = None if target.kv_cache_dtype == "auto" else target.kv_cache_dtype
    arch = plan.source.architecture
    return {
        "architecture": "LlamaForCausalLM" if arch.family == "llama" else arch.family,
        "dtype": plan.loaded.recipe.model.dtype,
        "max_position_embeddings": arch.max_position_embeddings,
        "quantization": {"quant_algo": QUANT_ALGO[QFORMAT[target.quant]],
                         "kv_cache_quant_algo": KV_CACHE_QUANT_ALGO[kv]},
        "mapping": {"world_size": target.tp * target.pp, "tp_size": target.tp,
                    "pp_size": target.pp},
    }


def engine_runs(plan: Plan) -> list[tuple[Target, dict[str, str], list[str]]]:
    found = []
    for run in plan.stages.values():
        if run.kind != KIND_ENGINE:
            continue
        assert run.argv is not None
        for target_id in run.targets:
            target = next(t.target for t in plan.targets if t.target.id == target_id)
            found.append((target, run.params["flags"], run.argv))
    return found


@pytest.mark.parametrize("recipe", SHIPPED)
def test_every_engine_target_builds_what_its_plan_says(recipe: str, tmp_path: Path) -> None:
    data = recipe_data(recipe)
    if "trtllm" not in (data.get("serve") or {}):
        # No engine targets (the tiny CPU recipe): nothing trtllm-build could override.
        assert "runtime: trtllm" not in yaml.safe_dump(data)
        return
    plan = plan_of(data, tmp_path)
    runs = engine_runs(plan)
    assert runs, f"{recipe} serves trtllm but plans no engine"
    for target, flags, argv in runs:
        args = parse("trtllm-build", "trtllm-build", argv[1:])
        built, warnings = build_config(args, checkpoint_config(plan, target), sm=target.gpu.sm)
        where = f"{target.id}: {shlex.join(argv[1:])}"
        assert warnings == [], f"trtllm-build overrides {warnings} for {where}"
        plugin = built["plugin_config"]
        for name in ON_OFF_FEATURES:
            assert plugin[name] is (flags[f"--{name}"] == "enable"), f"{name} for {where}"
        assert built["kv_cache_type"] == "PAGED"
        shape = target.shape
        assert built["max_batch_size"] == shape.max_batch_size
        assert built["max_input_len"] == shape.max_input_len
        assert built["max_seq_len"] == shape.max_seq_len
        if shape.max_num_tokens is not None:
            assert built["max_num_tokens"] == shape.max_num_tokens


def test_int4_awq_with_an_fp8_kv_cache_is_planned_without_paged_context_fmha(
    tmp_path: Path,
) -> None:
    """The fault the stand-in used to hide: the recipe asks for paged context FMHA, which
    TRT-LLM drops for these engines; the flags, the key and the plan say so."""
    plan = plan_of(recipe_data("llama70b-h100.yaml"), tmp_path)
    awq = [(t, f) for t, f, _ in engine_runs(plan) if t.quant == "int4_awq"]
    assert len(awq) == 3  # tp 8 chat and long, tp 1 long (tp 1 chat is excluded)
    assert plan.loaded.recipe.build.use_paged_context_fmha == "enable"
    for _, flags in awq:
        assert flags["--use_paged_context_fmha"] == "disable"
        assert flags["--use_fp8_context_fmha"] == "disable"
    fp8 = [f for t, f, _ in engine_runs(plan) if t.quant == "fp8"]
    assert fp8
    assert all(f["--use_paged_context_fmha"] == "enable" for f in fp8)
    assert all(f["--use_fp8_context_fmha"] == "enable" for f in fp8)
    lines = plan_lines(plan)
    told = [line for line in lines if "TRT-LLM builds use_paged_context_fmha enable → disable"
            in line]
    assert len(told) == 3


SHAPE = Shape(max_batch_size=128, max_input_len=2048, max_seq_len=4096, max_num_tokens=8192)


@pytest.mark.parametrize(
    ("quant", "kv", "asked", "paged", "fp8"),
    [
        # (paged context FMHA, FP8 context FMHA) asked -> what TRT-LLM builds
        ("int4_awq", "fp8", ("enable", "auto"), "disable", "disable"),
        ("int4_awq", "auto", ("enable", "enable"), "enable", "disable"),
        ("bf16", "fp8", ("enable", "auto"), "disable", "disable"),
        ("w4a8_awq", "fp8", ("enable", "disable"), "enable", "enable"),
        ("fp8", "auto", ("enable", "enable"), "enable", "disable"),
        ("fp8", "auto", ("disable", "enable"), "disable", "enable"),
        ("fp8", "fp8", ("enable", "disable"), "enable", "enable"),
        ("nvfp4", "fp8", ("enable", "auto"), "enable", "enable"),
        ("int8_sq", "int8", ("enable", "auto"), "disable", "disable"),
        ("fp8", "int8", ("enable", "auto"), "disable", "disable"),
    ],
)
def test_fmha_flags_agree_with_trtllms_rules(
    quant: str, kv: str, asked: tuple[str, str], paged: str, fp8: str
) -> None:
    settings = BuildSettings(use_paged_context_fmha=asked[0], use_fp8_context_fmha=asked[1])
    flags = build_flags(settings, SHAPE, quant, kv, tp=8, family="llama")  # type: ignore[arg-type]
    assert (flags["--use_paged_context_fmha"], flags["--use_fp8_context_fmha"]) == (paged, fp8)
    args = parse("trtllm-build", "trtllm-build",
                 [part for flag, value in flags.items() for part in (flag, value)])
    kv_algo = KV_CACHE_QUANT_ALGO[None if kv == "auto" else kv]
    pretrained = {"architecture": "LlamaForCausalLM", "max_position_embeddings": 131072,
                  "quantization": {"quant_algo": QUANT_ALGO[QFORMAT[quant]],
                                   "kv_cache_quant_algo": kv_algo},
                  "mapping": {"world_size": 8, "tp_size": 8, "pp_size": 1}}
    built, warnings = build_config(args, pretrained, sm=90)
    assert warnings == []
    assert built["plugin_config"]["use_paged_context_fmha"] is (paged == "enable")
    assert built["plugin_config"]["use_fp8_context_fmha"] is (fp8 == "enable")


def test_reduce_fusion_is_planned_as_trtllm_builds_it() -> None:
    settings = BuildSettings(reduce_fusion="enable")
    shape = SHAPE
    assert build_flags(settings, shape, "fp8", "fp8", tp=8, family="llama")[
        "--reduce_fusion"] == "enable"
    assert build_flags(settings, shape, "fp8", "fp8", tp=1, family="llama")[
        "--reduce_fusion"] == "disable"
    assert build_flags(settings, shape, "fp8", "fp8", tp=8, family="qwen2")[
        "--reduce_fusion"] == "disable"
    _, overrides = plugin_overrides(settings, "fp8", "fp8", tp=1, family="llama")
    assert [str(o) for o in overrides] == [(
        "reduce_fusion enable → disable (reduce fusion needs tp > 1 and a Llama, Gemma2 or "
        "Medusa model)")]


def test_an_engine_shape_trtllm_would_change_is_refused_at_plan_time(tmp_path: Path) -> None:
    data = recipe_data("llama8b-fleet.yaml")
    data["matrix"]["shape"] = [{"name": "tiny", "max_batch_size": 4, "max_input_len": 16,
                                "max_seq_len": 64, "max_num_tokens": 16}]
    with pytest.raises(PlanError, match=r"max_num_tokens 16 is below one KV-cache block; "
                                        r"TRT-LLM raises it to 32; set max_num_tokens"):
        plan_of(data, tmp_path)
    data["matrix"]["shape"][0]["max_num_tokens"] = 64
    data["build"] = {"remove_input_padding": "disable"}
    with pytest.raises(PlanError, match=r"is ignored with build\.remove_input_padding disable"):
        plan_of(data, tmp_path)
    del data["matrix"]["shape"][0]["max_num_tokens"]
    plan_of(data, tmp_path)  # without max_num_tokens, TRT-LLM builds what the shape says
