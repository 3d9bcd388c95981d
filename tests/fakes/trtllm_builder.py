"""What TensorRT-LLM 1.2's trtllm-build does with its arguments before it compiles anything,
for the trtllm-build stand-in (tests/fakes/bin/trtllm-build) and for tests that need the
answer without running it.

Each rule is read from TensorRT-LLM's source and names the file and function it follows; it is
written in TRT-LLM's terms (checkpoint quant_algo strings, PluginConfig field names), never in
enginectl's, so that enginectl's own copy of these rules (pipeline/stages/build.py) is checked
against an independent reading, not against itself. Sources read (NVIDIA/TensorRT-LLM, the
1.x code around 1.2; the exact v1.2.1 tag is not in the readable index):
    tensorrt_llm/commands/build.py @65f1d1536e18 (parse_arguments, main, build_model)
    tensorrt_llm/builder.py, stored version id 205252225 (BuildConfig, build, _init_max_seq_len;
        the same era as build.py above: no auto_parallel, lora_helper, pydantic PluginConfig)
    tensorrt_llm/_common.py, stored version id 39614393 (check_max_num_tokens)
    tensorrt_llm/plugin/plugin.py @c20322ffd3dc (PluginConfig fields and defaults)

The timing cache (`use_timing_cache`) follows the same two files: commands/build.py
@65f1d1536e18 defines --input_timing_cache (default None: "This option is ignored if the
file does not exist.")
and --output_timing_cache (default 'model.cache') and hands both to BuildConfig.from_dict as
they are; builder.py (stored version id 205252225) reads the input in
Builder.create_builder_config ("set timing cache": a missing file is warned about and a fresh
cache created; a cache TensorRT cannot create is replaced by a fresh one; then
set_timing_cache(cache, ignore_mismatch=False)), and build() has rank 0 alone call
Builder.save_timing_cache(builder_config, build_config.output_timing_cache), which opens that
path as given: a relative path is the current directory's, never --output_dir's.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

# PluginConfig's fields and their defaults (plugin.py PluginConfig); the dtype plugins hold a
# dtype string, "auto" or None (disabled), the features True/False.
PLUGIN_DEFAULTS: dict[str, Any] = {
    "dtype": "float16",
    "bert_attention_plugin": "auto", "gpt_attention_plugin": "auto", "gemm_plugin": None,
    "gemm_swiglu_plugin": None, "fp8_rowwise_gemm_plugin": None, "qserve_gemm_plugin": None,
    "identity_plugin": None, "nccl_plugin": "auto", "lora_plugin": None, "dora_plugin": False,
    "weight_only_groupwise_quant_matmul_plugin": None, "weight_only_quant_matmul_plugin": None,
    "smooth_quant_plugins": True, "smooth_quant_gemm_plugin": None,
    "layernorm_quantization_plugin": None, "rmsnorm_quantization_plugin": None,
    "quantize_per_token_plugin": False, "quantize_tensor_plugin": False, "moe_plugin": "auto",
    "mamba_conv1d_plugin": "auto", "low_latency_gemm_plugin": None,
    "low_latency_gemm_swiglu_plugin": None, "gemm_allreduce_plugin": None,
    "context_fmha": True, "bert_context_fmha_fp32_acc": False, "paged_kv_cache": None,
    "remove_input_padding": True, "norm_quant_fusion": False, "reduce_fusion": False,
    "user_buffer": False, "tokens_per_block": 32, "use_paged_context_fmha": True,
    "use_fp8_context_fmha": True, "fuse_fp4_quant": False, "multiple_profiles": False,
    "paged_state": True, "streamingllm": False, "manage_weights": False, "use_fused_mlp": True,
    "pp_reduce_scatter": False,
}
BOOL_FIELDS = frozenset(k for k, v in PLUGIN_DEFAULTS.items() if isinstance(v, bool))
FP8_FMHA_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")


class BuildRefused(Exception):  # noqa: N818 - named for what trtllm-build does, it refuses
    """What trtllm-build raises before building (RuntimeError or AssertionError there)."""


def plugin_config(args: dict[str, Any]) -> dict[str, Any]:
    """PluginConfig.from_arguments: the parsed flags over the defaults, with 'enable' → True
    and 'disable' → False for a feature or None for a dtype plugin (convert_enable_disable)."""
    config = dict(PLUGIN_DEFAULTS)
    for name in PLUGIN_DEFAULTS:
        value = args.get(name)
        if value is None:
            continue
        if value == "enable":
            value = True
        elif value == "disable":
            value = False if name in BOOL_FIELDS else None
        config[name] = value
    return config


def check_arguments(args: dict[str, Any]) -> None:
    """commands/build.py main() and build_model(): combinations refused before building."""
    if args.get("gather_context_logits") and (args.get("max_draft_len") or 0) > 0:
        raise BuildRefused("RuntimeError: Gather context logits is not support with draft "
                           "len > 0.")
    if args.get("build_config") is None and args.get("multiple_profiles") == "enable" \
            and args.get("opt_num_tokens") is not None:
        raise BuildRefused("RuntimeError: multiple_profiles is enabled, while opt_num_tokens "
                           "is set. They are not supposed to be working in the same time for "
                           "now.")
    if args.get("streamingllm") == "enable":  # build_model(): asserted for every model
        raise BuildRefused("AssertionError: StreamingLLM is no longer supported because "
                           "attention sink cannot work with the non-cyclic kv cache kernel & "
                           "runtime changes.")


def check_max_num_tokens(
    *, max_num_tokens: int | None, opt_num_tokens: int | None, max_batch_size: int,
    max_input_len: int, max_seq_len: int, max_beam_width: int, remove_input_padding: bool,
    enable_context_fmha: bool, tokens_per_block: int, multiple_profiles: bool,
) -> tuple[int | None, int | None]:
    """_common.py check_max_num_tokens: what max_num_tokens and opt_num_tokens become."""
    if not remove_input_padding:
        if max_num_tokens is not None or opt_num_tokens is not None:
            max_num_tokens = max_batch_size * max_seq_len
        return max_num_tokens, opt_num_tokens
    if max_num_tokens is None:
        max_num_tokens = max_seq_len * max_batch_size
    if opt_num_tokens is None and not multiple_profiles:
        opt_num_tokens = min(max_batch_size * max_beam_width, max_num_tokens)
    max_num_tokens = min(max_num_tokens, max_seq_len * max_batch_size)
    if max_num_tokens < max_input_len and not enable_context_fmha:
        max_num_tokens = max_input_len
    elif max_num_tokens < tokens_per_block and enable_context_fmha:
        max_num_tokens = tokens_per_block
    if opt_num_tokens is not None and opt_num_tokens > max_num_tokens:
        opt_num_tokens = max_num_tokens
    return max_num_tokens, opt_num_tokens


def init_max_seq_len(build: dict[str, Any], pretrained: dict[str, Any]) -> None:
    """builder.py _init_max_seq_len: max_seq_len deduced when absent (never null), max_input_len
    clipped to it, then check_max_num_tokens."""
    scaling = pretrained.get("rotary_scaling") or None
    factor = 1.0
    if scaling is not None:
        kind = scaling.get("type", scaling.get("rope_type"))
        factor = 1.0 if kind in ("su", "longrope", "llama3") else scaling.get("factor", 1.0)
    if build["max_seq_len"] is None:
        deduced = pretrained.get("max_position_embeddings") or 2048
        if factor != 1:
            deduced = math.ceil(deduced * factor)
        build["max_seq_len"] = int(deduced)
    build["max_input_len"] = min(build["max_input_len"], build["max_seq_len"])
    plugin = build["plugin_config"]
    build["max_num_tokens"], build["opt_num_tokens"] = check_max_num_tokens(
        max_num_tokens=build["max_num_tokens"], opt_num_tokens=build["opt_num_tokens"],
        max_batch_size=build["max_batch_size"], max_input_len=build["max_input_len"],
        max_seq_len=build["max_seq_len"], max_beam_width=build["max_beam_width"],
        remove_input_padding=plugin["remove_input_padding"],
        enable_context_fmha=plugin["context_fmha"], tokens_per_block=plugin["tokens_per_block"],
        multiple_profiles=plugin["multiple_profiles"],
    )


def apply_overrides(plugin: dict[str, Any], *, quant_algo: str | None,
                    kv_cache_quant_algo: str | None, architecture: str, tp_size: int,
                    sm: int) -> list[str]:
    """builder.py build(): the plugin features it changes with only a warning; returns the
    warnings. `plugin` is changed in place, as TRT-LLM changes its copy of the config."""
    warnings: list[str] = []
    if plugin["streamingllm"]:
        plugin["use_paged_context_fmha"] = False
        warnings.append("Paged Context FMHA is disabled because StreamingLLM is not supported "
                        "when enabling paged KV context FMHA.")
    if plugin["reduce_fusion"] and (tp_size == 1 or architecture not in (
            "LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM")):
        plugin["reduce_fusion"] = False
        warnings.append("Overriding reduce_fusion to False")
    if plugin["user_buffer"] and not plugin["reduce_fusion"]:
        plugin["user_buffer"] = False
        warnings.append("Overriding user_buffer to False")
    return warnings + _fmha_overrides(plugin, quant_algo, kv_cache_quant_algo, sm)


def _fmha_overrides(plugin: dict[str, Any], quant_algo: str | None,
                    kv_cache_quant_algo: str | None, sm: int) -> list[str]:
    """build(): "Logics to control paged_context_fmha and fp8_context_fmha", then the int8 KV
    cache rule after it."""
    warnings: list[str] = []
    fp8_kv = kv_cache_quant_algo == "FP8"
    if not plugin["context_fmha"]:
        plugin["use_fp8_context_fmha"] = False
        plugin["use_paged_context_fmha"] = False
        warnings.append("Context FMHA is disabled, FP8 Context FMHA and Paged Context FMHA are "
                        "disabled.")
    elif quant_algo not in FP8_FMHA_ALGOS:
        if plugin["use_fp8_context_fmha"]:
            plugin["use_fp8_context_fmha"] = False
            warnings.append("FP8 Context FMHA is disabled because it must be used together "
                            "with the fp8 quantization workflow.")
        if plugin["use_paged_context_fmha"] and fp8_kv:
            plugin["use_paged_context_fmha"] = False
            warnings.append("FP8 Paged Context FMHA is disabled because FP8 context FMHA is "
                            "disabled.")
    elif sm < 89:
        plugin["use_fp8_context_fmha"] = False
        warnings.append("FP8 context FMHA is disabled because it is only supported on Ada "
                        "and Hopper Arch.")
        if plugin["use_paged_context_fmha"] and fp8_kv:
            plugin["use_paged_context_fmha"] = False
            warnings.append("FP8 Paged Context FMHA is disabled because FP8 context FMHA is "
                            "disabled.")
    elif plugin["use_paged_context_fmha"]:
        if not fp8_kv and plugin["use_fp8_context_fmha"]:
            plugin["use_fp8_context_fmha"] = False
            warnings.append("FP8 Paged Context FMHA is disabled because it must be used "
                            "together with fp8 KV Cache.")
        elif fp8_kv and not plugin["use_fp8_context_fmha"]:
            plugin["use_fp8_context_fmha"] = True
            warnings.append("FP8 Context FMHA is enabled to support FP8 Paged Context FMHA.")
    if plugin["use_paged_context_fmha"] and kv_cache_quant_algo == "INT8":
        plugin["use_paged_context_fmha"] = False
        warnings.append("Paged Context FMHA is disabled because it doesn't work with int8 kv "
                        "cache currently.")
    return warnings


def build_config(args: dict[str, Any], pretrained: dict[str, Any], *, sm: int
                 ) -> tuple[dict[str, Any], list[str]]:
    """The build_config an engine's config.json records for these parsed trtllm-build flags
    and this checkpoint config: BuildConfig.from_dict (build.py main), update_kv_cache_type,
    the overrides of build() and _init_max_seq_len, in build()'s order. Raises BuildRefused
    for what trtllm-build refuses."""
    check_arguments(args)
    plugin = plugin_config(args)
    plugin["dtype"] = pretrained.get("dtype", plugin["dtype"])
    quantization = pretrained.get("quantization") or {}
    mapping = pretrained.get("mapping") or {}
    # BuildConfig.update_kv_cache_type: --kv_cache_type wins, then --paged_kv_cache, else PAGED.
    kv_type = args.get("kv_cache_type")
    if kv_type is None:
        paged_flag = args.get("paged_kv_cache")
        kv_type = "paged" if paged_flag in (None, "enable") else "continuous"
    plugin["paged_kv_cache"] = kv_type == "paged"
    build = {
        "max_input_len": args.get("max_input_len") or 1024,
        "max_seq_len": args.get("max_seq_len"),
        "opt_batch_size": 8,
        "max_batch_size": args.get("max_batch_size") or 2048,
        "max_beam_width": args.get("max_beam_width") or 1,
        "max_num_tokens": args.get("max_num_tokens") or 8192,
        "opt_num_tokens": args.get("opt_num_tokens"),
        "max_prompt_embedding_table_size": args.get("max_prompt_embedding_table_size") or 0,
        "kv_cache_type": kv_type.upper(),
        "gather_context_logits": bool(args.get("gather_context_logits")),
        "gather_generation_logits": bool(args.get("gather_generation_logits")),
        "strongly_typed": True,
        "max_draft_len": args.get("max_draft_len") or 0,
        "use_refit": False,
        "use_strip_plan": bool(args.get("strip_plan")),
        "weight_sparsity": bool(args.get("weight_sparsity")),
        "weight_streaming": bool(args.get("weight_streaming")),
        "monitor_memory": bool(args.get("monitor_memory")),
        "plugin_config": plugin,
    }
    init_max_seq_len(build, pretrained)
    warnings = apply_overrides(
        plugin, quant_algo=quantization.get("quant_algo"),
        kv_cache_quant_algo=quantization.get("kv_cache_quant_algo"),
        architecture=str(pretrained.get("architecture")),
        tp_size=int(mapping.get("tp_size") or 1), sm=sm)
    return build, warnings


def layer_tactics(build: dict[str, Any], pretrained: dict[str, Any], *, sm: int
                  ) -> dict[str, dict[str, str]]:
    """What the TensorRT builder times for rank 0 of this engine: one entry per distinct layer
    configuration (a repeated layer is timed once), keyed by kind, dtype and the shapes of the
    optimisation profile, so that engines of another shape share some entries (the norm) and
    not others (the GEMMs over max_num_tokens). The tactic and its time are made up, but the
    same for the same key and SM."""
    dtype = build["plugin_config"]["dtype"]
    mapping = pretrained.get("mapping") or {}
    tp = int(mapping.get("tp_size") or 1)
    hidden = int(pretrained.get("hidden_size") or 0)
    inter = int(pretrained.get("intermediate_size") or 4 * hidden)
    vocab = int(pretrained.get("vocab_size") or 0)
    tokens, batch = build["max_num_tokens"], build["max_batch_size"]
    keys = [
        f"rmsnorm|{dtype}|hidden={hidden}",
        f"gemm|{dtype}|m={tokens}|n={3 * hidden // tp}|k={hidden}",
        f"gemm|{dtype}|m={tokens}|n={hidden}|k={hidden // tp}",
        f"gemm|{dtype}|m={tokens}|n={2 * inter // tp}|k={hidden}",
        f"gemm|{dtype}|m={tokens}|n={hidden}|k={inter // tp}",
        f"attention|{dtype}|batch={batch}|seq={build['max_seq_len']}",
        f"gemm|{dtype}|m={batch}|n={vocab // tp}|k={hidden}",
    ]
    tactics = {}
    for key in keys:
        digest = hashlib.sha256(f"{sm}|{key}".encode()).hexdigest()
        tactics[key] = {"tactic": f"0x{digest[:16]}", "ms": f"{int(digest[16:20], 16) / 1e4:.4f}"}
    return tactics


def use_timing_cache(args: dict[str, Any], tactics: dict[str, dict[str, str]],
                     trt: Any, log: list[str]) -> dict[str, Any]:
    """Rank 0's timing cache, as builder.py handles it with *trt* (the `tensorrt` module; the
    stand-in's, tests/fakes/python/tensorrt): read --input_timing_cache when the file exists,
    time *tactics* against it, write --output_timing_cache (default 'model.cache', relative to
    the current directory). Appends TRT-LLM's log lines to *log*; returns what a test records:
    {"input_timing_cache", "loaded" (entries read, None when none was used), "hits", "misses",
    "output_timing_cache" (the absolute path written), "entries" (how many it holds)}.
    Raises BuildRefused as build() does when there was no cache to save."""
    logger = trt.Logger(trt.Logger.WARNING)
    config = trt.Builder(logger).create_builder_config()
    source = args.get("input_timing_cache")
    cache = None
    if source is not None:
        if Path(source).exists():
            cache = config.create_timing_cache(Path(source).read_bytes())
        else:
            log.append("[TRT-LLM] [W] Invalid timing cache, using freshly created one")
    loaded = None if cache is None else len(cache.entries)
    if cache is None:
        cache = config.create_timing_cache(b"")
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        loaded = None
    hits, misses = trt.stand_in_time_layers(config, tactics)
    target = args.get("output_timing_cache") or "model.cache"  # BuildConfig's default
    written = config.get_timing_cache()
    if written is None:
        log.append("[TRT-LLM] [W] No timing cache found in the given builder config, skip "
                   "saving.")
        raise BuildRefused("AssertionError: Failed to save timing cache.")
    Path(target).write_bytes(bytes(memoryview(written.serialize())))
    log.append(f"[TRT-LLM] [I] Timing cache serialized to {target}")
    return {"input_timing_cache": source, "loaded": loaded, "hits": hits, "misses": misses,
            "output_timing_cache": str(Path(target).resolve()), "entries": len(written.entries)}
