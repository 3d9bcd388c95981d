"""Serving argv for the three runtimes: what a no-build entry stores and what smoke starts.

`{port}` stays a placeholder: the smoke harness picks a free loopback port at start.
"""

from __future__ import annotations

from pathlib import Path, PurePath

from pipeline.recipe import KvCacheDtype, ModelDtype, Quant, Shape, TrtllmServe, VllmServe

PORT = "{port}"
HOST = "127.0.0.1"


def trtllm_served_name(model: str, *, is_dir: bool) -> str:
    """The model id `trtllm-serve MODEL` lists in /v1/models and puts in its answers: the
    directory's name for a local directory, else MODEL as given (TensorRT-LLM 1.2,
    tensorrt_llm/serve/openai_server.py `OpenAIServer.__init__`; serve.py has no option to
    name it)."""
    return PurePath(model).name if is_dir else model


def trtllm_serve_argv(
    *,
    model_dir: Path,
    tokenizer_dir: Path | None,
    backend: str,
    tp: int,
    pp: int,
    shape: Shape,
    settings: TrtllmServe,
) -> list[str]:
    argv = ["trtllm-serve", str(model_dir), "--backend", backend]
    if tokenizer_dir is not None:
        argv += ["--tokenizer", str(tokenizer_dir)]
    argv += [
        "--host", HOST,
        "--port", PORT,
        "--tp_size", str(tp),
        "--pp_size", str(pp),
        "--max_batch_size", str(shape.max_batch_size),
        "--max_seq_len", str(shape.max_seq_len),
    ]
    if shape.max_num_tokens is not None:
        argv += ["--max_num_tokens", str(shape.max_num_tokens)]
    argv += ["--kv_cache_free_gpu_memory_fraction", str(settings.kv_cache_free_gpu_memory_fraction)]
    return argv


def vllm_quantization(quant: Quant, prequantized: bool) -> str | None:
    """vLLM's --quantization for a target: online FP8 from a bf16 checkpoint, or the
    modelopt format of a checkpoint quantized by our quantize stage."""
    if quant in ("bf16", "fp16"):
        return None
    if not prequantized:
        return quant  # only fp8 is served this way (see plan.py)
    return "modelopt_fp4" if quant == "nvfp4" else "modelopt"


def vllm_argv(
    python: str,
    *,
    model_dir: Path,
    served_name: str,
    dtype: ModelDtype,
    quant: Quant,
    kv_cache_dtype: KvCacheDtype,
    prequantized: bool,
    tp: int,
    pp: int,
    shape: Shape,
    settings: VllmServe,
) -> list[str]:
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--host", HOST,
        "--port", PORT,
        "--dtype", "float16" if quant == "fp16" else dtype,
        "--tensor-parallel-size", str(tp),
        "--pipeline-parallel-size", str(pp),
        "--max-model-len", str(shape.max_seq_len),
        "--max-num-seqs", str(shape.max_batch_size),
    ]
    if shape.max_num_tokens is not None:
        argv += ["--max-num-batched-tokens", str(shape.max_num_tokens)]
    quantization = vllm_quantization(quant, prequantized)
    if quantization is not None:
        argv += ["--quantization", quantization]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    return argv
