"""The quantizer's work: load, calibrate with modelopt, export, check, record provenance,
rename into place; and `main`, its command line."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.stages.quantizer.checks import (
    _read_json,
    check_awq_shapes,
    source_rope_theta,
    validate_hf_checkpoint,
    validate_trtllm_checkpoint,
)
from pipeline.stages.quantizer.options import (
    _INT8_KV_CFG,
    AWQ_QFORMATS,
    DECODER_TYPE,
    DTYPES,
    MODELOPT_CONFIG,
    PROG,
    PROVENANCE,
    TOKENIZER_FILES,
    TRTLLM_AWQ_CALIB_CAP,
    Calibration,
    Options,
    QuantizerError,
    calibration_samples,
    load_calibration,
    one_line,
    parse_args,
)

# --- the work -------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _check_output_dir(out: Path) -> None:
    """OUT may be absent, empty, or an earlier output of this program (which is replaced)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise QuantizerError(f"--output_dir {str(out)!r} exists and is not a directory")
    if any(out.iterdir()) and not (out / PROVENANCE).is_file():
        raise QuantizerError(
            f"--output_dir {str(out)!r} is not empty and was not written by {PROG}; "
            "pass an empty or new directory"
        )


def quant_config(mtq: Any, qformat: str, kv_cache_dtype: str | None, awq_block_size: int) -> Any:
    """The modelopt config for *qformat* plus the KV-cache quantizers, as TRT-LLM builds it."""
    name = MODELOPT_CONFIG[qformat]
    if name is None:
        config: dict[str, Any] = {
            "quant_cfg": {"*weight_quantizer": {"enable": False},
                          "*input_quantizer": {"enable": False},
                          "*lm_head*": {"enable": False}, "default": {"enable": False}},
            "algorithm": "max",
        }
    else:
        config = copy.deepcopy(getattr(mtq, name))
    if qformat in AWQ_QFORMATS:
        weight = config["quant_cfg"]["*weight_quantizer"]
        first = weight[0] if isinstance(weight, list) else weight
        first["block_sizes"][-1] = awq_block_size
    if kv_cache_dtype == "fp8":
        config["quant_cfg"].update(copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]))
    elif kv_cache_dtype == "int8":
        config["quant_cfg"].update(copy.deepcopy(_INT8_KV_CFG))
    return config


def _torch_dtype(torch: Any, dtype: str, source_config: dict[str, Any]) -> Any:
    if dtype == "auto":
        dtype = str(source_config.get("dtype") or source_config.get("torch_dtype") or "float16")
    if dtype not in DTYPES[1:]:
        raise QuantizerError(f"the source config.json has dtype {dtype!r}; pass --dtype")
    return getattr(torch, dtype)


def _batches(tokenizer: Any, samples: list[str], opts: Options) -> Iterator[dict[str, Any]]:
    for start in range(0, len(samples), opts.batch_size):
        yield dict(tokenizer(
            samples[start : start + opts.batch_size], return_tensors="pt", padding=True,
            truncation=True, max_length=opts.calib_max_seq_length,
        ))


@dataclass
class _Loaded:
    """The libraries and the model, once loaded (all Any: the libraries are untyped)."""

    torch: Any
    model: Any
    tokenizer: Any
    torch_dtype: Any
    device: str


def quantize(opts: Options) -> dict[str, Any]:
    """Quantize and export as *opts* says; return the provenance record written to OUT."""
    _check_output_dir(opts.output_dir)
    source_config = _read_json(opts.model_dir / "config.json")
    if opts.qformat in AWQ_QFORMATS:
        check_awq_shapes(source_config, opts.awq_block_size, opts.tp_size)
    calibration = load_calibration(opts.calib_dataset, opts.calib_size)
    rope_theta = source_rope_theta(opts.model_dir)

    loaded = _load(opts, source_config)
    started = time.monotonic()
    samples, tokens = _calibrate(loaded, opts, calibration)
    calibrated = time.monotonic()

    out = opts.output_dir
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        _export(loaded, opts, stage)
        for name in TOKENIZER_FILES:
            if (opts.model_dir / name).is_file():
                shutil.copyfile(opts.model_dir / name, stage / name)
        if opts.export_format == "hf":
            validate_hf_checkpoint(
                stage, qformat=opts.qformat, kv_cache_dtype=opts.kv_cache_dtype,
                rope_theta=rope_theta,
            )
            algo = _read_json(stage / "hf_quant_config.json").get("quantization") or {}
        else:
            written = validate_trtllm_checkpoint(
                stage, qformat=opts.qformat, kv_cache_dtype=opts.kv_cache_dtype,
                tp_size=opts.tp_size, pp_size=opts.pp_size, rope_theta=rope_theta,
                awq_block_size=opts.awq_block_size,
            )
            algo = written.get("quantization") or {}
        record = _provenance(
            loaded, opts, calibration=calibration, samples=samples, tokens=tokens, algo=algo,
            rope_theta=rope_theta, stage=stage,
        )
        (stage / PROVENANCE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n",
                                        encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _progress(f"wrote {out} ({record['quant_algo'] or 'unquantized'}, KV "
              f"{record['kv_cache_quant_algo'] or 'unquantized'}; calibration "
              f"{calibrated - started:.1f}s, export {time.monotonic() - calibrated:.1f}s)")
    return record


def _load(opts: Options, source_config: dict[str, Any]) -> _Loaded:
    # TRT-LLM 1.2.1 ships modelopt 0.37 with transformers 4.57.3, which modelopt warns about.
    warnings.filterwarnings("ignore", message="transformers version .* is incompatible")
    import torch
    import transformers

    torch_dtype = _torch_dtype(torch, opts.dtype, source_config)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if opts.qformat == "nvfp4" and not cuda:
        raise QuantizerError(
            "nvfp4 needs a CUDA GPU: modelopt packs FP4 weights on the GPU at export; "
            "run this stage on a GPU builder"
        )
    _progress(f"loading {opts.model_dir} ({str(torch_dtype).removeprefix('torch.')}, {device})")
    tokenizer = transformers.AutoTokenizer.from_pretrained(opts.model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # transformers 4.56 renamed torch_dtype to dtype; an older one would ignore `dtype`.
    release = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if release >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        opts.model_dir, device_map="auto" if cuda else "cpu", **{dtype_arg: torch_dtype}
    ).eval()
    return _Loaded(torch, model, tokenizer, torch_dtype, device)


def _calibrate(
    loaded: _Loaded, opts: Options, calibration: Calibration
) -> tuple[list[str], int]:
    """Insert the quantizers and calibrate them; return the samples used and their tokens."""
    if opts.qformat == "full_prec" and opts.kv_cache_dtype is None:
        return [], 0
    import modelopt.torch.quantization as mtq

    torch = loaded.torch
    samples = calibration_samples(calibration, opts.calib_size)
    batches = list(_batches(loaded.tokenizer, samples, opts))
    tokens = int(sum(int(b["attention_mask"].sum()) for b in batches))
    kv = f", KV cache {opts.kv_cache_dtype}" if opts.kv_cache_dtype else ""
    _progress(f"calibrating {opts.qformat}{kv} on {len(samples)} samples "
              f"({len(batches)} batches, {tokens} tokens)…")
    if opts.qformat in AWQ_QFORMATS and len(samples) > TRTLLM_AWQ_CALIB_CAP:
        _progress(f"AWQ on all {len(samples)} samples, as asked (TensorRT-LLM's quantize.py "
                  f"would use {TRTLLM_AWQ_CALIB_CAP}; ask for {TRTLLM_AWQ_CALIB_CAP} to match it)")

    def forward_loop(model: Any) -> None:
        with torch.no_grad():
            for batch in batches:
                model(**{k: v.to(model.device) for k, v in batch.items()})

    config = quant_config(mtq, opts.qformat, opts.kv_cache_dtype, opts.awq_block_size)
    with contextlib.redirect_stdout(sys.stderr):
        loaded.model = mtq.quantize(loaded.model, config, forward_loop=forward_loop)
    return samples, tokens


def _export(loaded: _Loaded, opts: Options, stage: Path) -> None:
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint

    model = loaded.model
    if loaded.device == "cuda":  # device_map="auto" hooks would move weights during export
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(model, recurse=True)
    with loaded.torch.inference_mode(), contextlib.redirect_stdout(sys.stderr):
        if opts.export_format == "hf":
            _progress("exporting a unified Hugging Face checkpoint…")
            export_hf_checkpoint(model, dtype=loaded.torch_dtype, export_dir=stage)
            return
        model_type = model.config.model_type
        decoder = DECODER_TYPE.get(model_type, model_type)
        _progress(f"exporting a TensorRT-LLM checkpoint ({decoder}, tp {opts.tp_size}, "
                  f"pp {opts.pp_size})…")
        export_tensorrt_llm_checkpoint(
            model, decoder_type=decoder, dtype=loaded.torch_dtype, export_dir=stage,
            inference_tensor_parallel=opts.tp_size, inference_pipeline_parallel=opts.pp_size,
        )
    _finish_trtllm_config(stage, opts, decoder, type(model).__name__, model.config)


def _provenance(
    loaded: _Loaded, opts: Options, *, calibration: Calibration, samples: list[str],
    tokens: int, algo: dict[str, Any], rope_theta: float | None, stage: Path,
) -> dict[str, Any]:
    import modelopt
    import transformers

    return {
        "tool": "pipeline.quantizer",
        "qformat": opts.qformat,
        "kv_cache_dtype": opts.kv_cache_dtype,
        "dtype": str(loaded.torch_dtype).removeprefix("torch."),
        "export_format": opts.export_format,
        "tp_size": opts.tp_size,
        "pp_size": opts.pp_size,
        "awq_block_size": opts.awq_block_size if opts.qformat in AWQ_QFORMATS else None,
        "quant_algo": algo.get("quant_algo"),
        "kv_cache_quant_algo": algo.get("kv_cache_quant_algo"),
        "calibration": {
            "dataset": calibration.name,
            "sha256": calibration.sha256,
            "texts": len(calibration.texts),
            "samples": len(samples),
            "max_seq_length": opts.calib_max_seq_length,
            "batch_size": opts.batch_size,
            "tokens": tokens,
        },
        "source": {
            "model_type": loaded.model.config.model_type,
            "architecture": type(loaded.model).__name__,
            "rope_theta": rope_theta,
        },
        "device": loaded.device,
        "versions": {
            "torch": loaded.torch.__version__,
            "transformers": transformers.__version__,
            "modelopt": modelopt.__version__,
        },
        "files": sorted(p.name for p in stage.iterdir() if p.is_file()),
    }


def _finish_trtllm_config(
    out: Path, opts: Options, decoder: str, architecture: str, hf_config: Any
) -> None:
    """What TRT-LLM's quantize.py writes into config.json after modelopt's export."""
    path = out / "config.json"
    config = _read_json(path)
    config["model_type"] = decoder
    config["architecture"] = architecture
    quantization = config.setdefault("quantization", {})
    if opts.qformat == "full_prec":
        quantization["quant_algo"] = None
    if opts.kv_cache_dtype is None and opts.qformat in ("fp8", "nvfp4"):
        quantization["kv_cache_quant_algo"] = None
    if "rotary_scaling" not in config and hasattr(hf_config, "rope_scaling"):
        config["rotary_scaling"] = hf_config.rope_scaling
    path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        quantize(opts)
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the program's edge: every failure is one line
        if opts.traceback:
            traceback.print_exc()
        message = str(exc) if isinstance(exc, QuantizerError) else (
            f"{type(exc).__name__}: {exc}"
        )
        print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
        return 1
    return 0

