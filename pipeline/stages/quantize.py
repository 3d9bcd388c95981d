"""quantize: NVIDIA modelopt post-training quantization → TRT-LLM checkpoint or unified HF.

The program is enginectl's own modelopt driver (`python -m pipeline.stages.quantizer`), whose flags
are a strict subset of TensorRT-LLM's `examples/quantization/quantize.py`, spelled the same,
so one argv reads the same to anyone who knows that script.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.recipe.fields import KvCacheDtype, ModelDtype, Quant
from pipeline.recipe.schema import Calibration

Export = Literal["trtllm", "hf"]

# recipe quant -> quantize.py --qformat; bf16/fp16 reach this stage only for a quantized KV cache.
QFORMAT: dict[str, str] = {
    "fp8": "fp8",
    "int4_awq": "int4_awq",
    "int8_sq": "int8_sq",
    "w4a8_awq": "w4a8_awq",
    "nvfp4": "nvfp4",
    "bf16": "full_prec",
    "fp16": "full_prec",
}


def needs_quantize(quant: Quant, kv_cache_dtype: KvCacheDtype) -> bool:
    return quant not in ("bf16", "fp16") or kv_cache_dtype != "auto"


@dataclass(frozen=True)
class QuantizeSpec:
    """What the quantizer is asked for: the numerics, the calibration (*calib_path*: the
    recipe's calibration file, resolved; None: its named dataset) and the export (a
    TensorRT-LLM checkpoint split for *tp* x *pp*, or an HF checkpoint)."""

    dtype: ModelDtype
    quant: Quant
    kv_cache_dtype: KvCacheDtype
    calibration: Calibration
    calib_path: Path | None
    awq_block_size: int
    export: Export
    tp: int = 1
    pp: int = 1


def quantize_argv(python: str, spec: QuantizeSpec, *, model_dir: Path,
                  output_dir: Path) -> list[str]:
    """The quantizer's argv (`pipeline.stages.quantizer`) for *spec*, run by *python*."""
    dtype, quant, kv_cache_dtype = spec.dtype, spec.quant, spec.kv_cache_dtype
    calibration, calib_path, export = spec.calibration, spec.calib_path, spec.export
    awq_block_size, tp, pp = spec.awq_block_size, spec.tp, spec.pp
    argv = [
        python, "-m", "pipeline.stages.quantizer",
        "--model_dir", str(model_dir),
        "--dtype", "float16" if quant == "fp16" else dtype,
        "--qformat", QFORMAT[quant],
    ]
    if kv_cache_dtype != "auto":
        argv += ["--kv_cache_dtype", kv_cache_dtype]
    dataset = str(calib_path) if calib_path is not None else str(calibration.dataset)
    argv += [
        "--calib_dataset", dataset,
        "--calib_size", str(calibration.samples),
        "--calib_max_seq_length", str(calibration.seq_len),
        "--batch_size", str(calibration.batch_size),
    ]
    if quant in ("int4_awq", "w4a8_awq"):
        argv += ["--awq_block_size", str(awq_block_size)]
    if export == "trtllm":
        argv += ["--tp_size", str(tp), "--pp_size", str(pp)]
    else:
        argv += ["--export_format", "hf"]
    argv += ["--output_dir", str(output_dir)]
    return argv
