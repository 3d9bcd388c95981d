"""build: `trtllm-build` on the target GPU → one engine per rank plus config.json."""

from __future__ import annotations

from pathlib import Path

from pipeline.recipe import BuildSettings, KvCacheDtype, Quant, Shape


def build_flags(
    settings: BuildSettings, shape: Shape, quant: Quant, kv_cache_dtype: KvCacheDtype
) -> dict[str, str]:
    """The trtllm-build flags a target asks for, in the order they are emitted.

    These, not the argv (which holds paths), go into the build key.
    """
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
    flags["--use_paged_context_fmha"] = settings.use_paged_context_fmha
    fp8_fmha = settings.use_fp8_context_fmha
    if fp8_fmha == "auto":
        fp8_fmha = "enable" if quant in ("fp8", "nvfp4") and kv_cache_dtype == "fp8" else "disable"
    flags["--use_fp8_context_fmha"] = fp8_fmha
    flags["--multiple_profiles"] = settings.multiple_profiles
    flags["--reduce_fusion"] = settings.reduce_fusion
    return flags


def build_argv(
    *, checkpoint_dir: Path, output_dir: Path, flags: dict[str, str], workers: int
) -> list[str]:
    argv = ["trtllm-build", "--checkpoint_dir", str(checkpoint_dir)]
    argv += ["--output_dir", str(output_dir)]
    for flag, value in flags.items():
        argv += [flag, value]
    argv += ["--workers", str(workers)]
    return argv
