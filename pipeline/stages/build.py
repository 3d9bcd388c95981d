"""build: `trtllm-build` on the target GPU → one engine per rank plus config.json.

trtllm-build does not always build what its flags say: TensorRT-LLM 1.2's `build()`
(tensorrt_llm/builder.py, "Logics to control paged_context_fmha and fp8_context_fmha", and the
reduce_fusion override above it) turns some plugin features off, or on, with only a warning.
enginectl applies the same rules here and emits what TRT-LLM will really build, so the argv,
the build key (the flags are its params) and `plan` all say what the engine is; the build
stage then reads the engine's config.json and fails if its plugin_config says otherwise.

The TensorRT timing cache flags (--input_timing_cache, --output_timing_cache) are not here:
they change how long a build takes, not what the engine computes, so they stay out of the
flags and the key and are added when the build runs (`pipeline.stages.timing_cache`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.recipe.fields import KvCacheDtype, Quant
from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import BuildSettings
from pipeline.stages.refit import STRIP_FLAG

# The quantizations whose checkpoints TRT-LLM gives FP8 context FMHA: QuantAlgo.FP8, W4A8_AWQ
# and NVFP4 (builder.py build() and optimize_model_with_config()).
FP8_FMHA_QUANTS = frozenset({"fp8", "w4a8_awq", "nvfp4"})
# reduce_fusion stays on only at tp > 1 for LlamaForCausalLM, Gemma2ForCausalLM and
# MedusaForCausalLM checkpoints (builder.py build(): 'Overriding reduce_fusion to False').
REDUCE_FUSION_FAMILIES = frozenset({"llama", "gemma2", "medusa"})
# The enable/disable features enginectl emits, as named in PluginConfig and so in the engine's
# config.json build_config.plugin_config (tensorrt_llm/plugin/plugin.py).
ON_OFF_FEATURES = (
    "remove_input_padding", "use_paged_context_fmha", "use_fp8_context_fmha",
    "multiple_profiles", "reduce_fusion",
)


@dataclass(frozen=True, slots=True)
class Override:
    """A setting TRT-LLM changes at build time, and why: what `plan` reports."""

    feature: str
    asked: str
    built: str
    why: str

    def __str__(self) -> str:
        return f"{self.feature} {self.asked} → {self.built} ({self.why})"


def plugin_overrides(
    settings: BuildSettings, quant: Quant, kv_cache_dtype: KvCacheDtype, *, tp: int,
    family: str,
) -> tuple[dict[str, bool], list[Override]]:
    """The FMHA and fusion features TRT-LLM 1.2 builds for these settings, and what it
    changed. Context FMHA is always on (enginectl never turns it off); the `SM < 89` branch
    of build() cannot apply, because plan-time checks refuse fp8, w4a8_awq and nvfp4 below
    SM 89."""
    paged = settings.use_paged_context_fmha == "enable"
    fp8 = (quant in FP8_FMHA_QUANTS and kv_cache_dtype == "fp8"
           if settings.use_fp8_context_fmha == "auto"
           else settings.use_fp8_context_fmha == "enable")
    reduce_fusion = settings.reduce_fusion == "enable"
    asked = {"use_paged_context_fmha": paged, "use_fp8_context_fmha": fp8,
             "reduce_fusion": reduce_fusion}
    why: dict[str, str] = {}
    if quant not in FP8_FMHA_QUANTS:
        if fp8:
            fp8, why["use_fp8_context_fmha"] = False, (
                f"FP8 context FMHA needs fp8, w4a8_awq or nvfp4 weights, not {quant}")
        if paged and kv_cache_dtype == "fp8":
            paged, why["use_paged_context_fmha"] = False, (
                f"no paged context FMHA for {quant} weights with an fp8 KV cache")
    elif paged:
        if kv_cache_dtype != "fp8" and fp8:
            fp8, why["use_fp8_context_fmha"] = False, (
                "FP8 paged context FMHA needs an fp8 KV cache")
        elif kv_cache_dtype == "fp8" and not fp8:
            fp8, why["use_fp8_context_fmha"] = True, (
                "paged context FMHA with an fp8 KV cache runs in FP8")
    if paged and kv_cache_dtype == "int8":
        paged, why["use_paged_context_fmha"] = False, (
            "no paged context FMHA with an int8 KV cache")
    if reduce_fusion and (tp == 1 or family not in REDUCE_FUSION_FAMILIES):
        reduce_fusion, why["reduce_fusion"] = False, (
            "reduce fusion needs tp > 1 and a Llama, Gemma2 or Medusa model")
    built = {"use_paged_context_fmha": paged, "use_fp8_context_fmha": fp8,
             "reduce_fusion": reduce_fusion}
    overrides = [Override(name, _on_off(asked[name]), _on_off(built[name]), reason)
                 for name, reason in why.items() if asked[name] != built[name]]
    return built, overrides


def _on_off(value: bool) -> str:
    return "enable" if value else "disable"


def build_flags(
    settings: BuildSettings, shape: Shape, quant: Quant, kv_cache_dtype: KvCacheDtype,
    *, tp: int, family: str,
) -> dict[str, str]:
    """The trtllm-build flags a target asks for, in the order they are emitted: what
    TRT-LLM will build (see plugin_overrides), never a request it would silently change.

    These, not the argv (which holds paths), go into the build key.
    """
    built, _ = plugin_overrides(settings, quant, kv_cache_dtype, tp=tp, family=family)
    flags = {
        "--gemm_plugin": settings.gemm_plugin,
        "--gpt_attention_plugin": settings.gpt_attention_plugin,
        "--max_batch_size": str(shape.max_batch_size),
        "--max_input_len": str(shape.max_input_len),
        "--max_seq_len": str(shape.max_seq_len),
    }
    if shape.max_num_tokens is not None:
        flags["--max_num_tokens"] = str(shape.max_num_tokens)
    flags["--max_beam_width"] = str(settings.max_beam_width)
    flags["--remove_input_padding"] = settings.remove_input_padding
    flags["--kv_cache_type"] = "paged"
    flags["--use_paged_context_fmha"] = _on_off(built["use_paged_context_fmha"])
    flags["--use_fp8_context_fmha"] = _on_off(built["use_fp8_context_fmha"])
    flags["--multiple_profiles"] = settings.multiple_profiles
    flags["--reduce_fusion"] = _on_off(built["reduce_fusion"])
    if settings.strip_plan:  # only when asked: the keys of whole engines stay as they were
        flags[STRIP_FLAG] = "enable"
    return flags


def expected_plugin_config(flags: Mapping[str, str]) -> dict[str, bool]:
    """What the engine's build_config.plugin_config must hold for *flags* (the on/off
    features; plugin dtypes such as gemm_plugin 'auto' are resolved by TRT-LLM)."""
    return {name: flags[f"--{name}"] == "enable" for name in ON_OFF_FEATURES
            if f"--{name}" in flags}


def plugin_mismatches(flags: Mapping[str, str], build_config: Mapping[str, Any]) -> list[str]:
    """How an engine's build_config differs from what its flags asked, one phrase each."""
    plugin = build_config.get("plugin_config")
    if not isinstance(plugin, Mapping):
        return ["build_config has no plugin_config"]
    wrong = [f"plugin_config.{name} is {plugin.get(name)!r}, the plan asked for {wanted}"
             for name, wanted in expected_plugin_config(flags).items()
             if plugin.get(name) is not wanted]
    if flags.get("--kv_cache_type") == "paged" and build_config.get("kv_cache_type") != "PAGED":
        wrong.append(f"kv_cache_type is {build_config.get('kv_cache_type')!r}, the plan asked "
                     "for 'PAGED'")
    if (flags.get(STRIP_FLAG) == "enable") != bool(build_config.get("use_strip_plan")):
        wrong.append(f"use_strip_plan is {build_config.get('use_strip_plan')!r}, the plan "
                     f"asked for {flags.get(STRIP_FLAG) == 'enable'}")
    beam = flags.get("--max_beam_width")
    if beam is not None and build_config.get("max_beam_width") != int(beam):
        wrong.append(f"max_beam_width is {build_config.get('max_beam_width')!r}, the plan "
                     f"asked for {beam}")
    return wrong


def build_argv(
    *, checkpoint_dir: Path, output_dir: Path, flags: dict[str, str], workers: int
) -> list[str]:
    argv = ["trtllm-build", "--checkpoint_dir", str(checkpoint_dir)]
    argv += ["--output_dir", str(output_dir)]
    for flag, value in flags.items():
        argv += [flag] if flag == STRIP_FLAG else [flag, value]  # store_true: no value
    argv += ["--workers", str(workers)]
    return argv
