"""enginectl's modelopt driver: quantize a Hugging Face checkpoint and export it.

    python -m pipeline.quantizer --model_dir DIR --dtype bfloat16 --qformat fp8 \\
        [--kv_cache_dtype fp8] --calib_dataset calib.jsonl --calib_size 16 \\
        --calib_max_seq_length 64 --batch_size 4 [--awq_block_size 128] \\
        [--tp_size 1 --pp_size 1 | --export_format hf] --output_dir OUT

Its flags are a subset of TensorRT-LLM's `examples/quantization/quantize.py`, spelled the same
(`--export_format` is from one version of it; `--traceback` is ours), so the argv that
`pipeline.stages.quantize.quantize_argv` emits reads the same to anyone who knows that script.

What it does: load the model (CPU unless CUDA is there) and tokenizer; run NVIDIA modelopt
post-training quantization with the qformat's config (plus a KV-cache config) over calibration
text from a local `.jsonl` ("text" per line) or text file, or a named dataset when `datasets`
is installed; export a TensorRT-LLM checkpoint (`config.json` + `rank{N}.safetensors`) or a
unified Hugging Face checkpoint; copy the tokenizer beside it; check what was written (the
ranks, the quantization algorithms, the mapping, `rotary_base` against the source's
`rope_theta`); record what was done in `enginectl-quantize.json`. The output appears whole or
not at all: it is written beside OUT and renamed into place after the checks.

Exit status: 0 done, 1 failed (one `quantizer: error: ...` line on stderr; the stack with
`--traceback`), 2 bad usage. torch, transformers and modelopt are imported only when the
work starts, so importing this module is cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
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

PROG = "quantizer"
PROVENANCE = "enginectl-quantize.json"

QFORMATS = ("fp8", "int4_awq", "int8_sq", "w4a8_awq", "nvfp4", "full_prec")
KV_CACHE_DTYPES = ("fp8", "int8")
DTYPES = ("auto", "float16", "bfloat16", "float32")
EXPORT_FORMATS = ("tensorrt_llm", "hf")

# qformat -> the modelopt config it starts from (None: no weight or activation quantization).
MODELOPT_CONFIG: dict[str, str | None] = {
    "fp8": "FP8_DEFAULT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "full_prec": None,
}
# qformat / KV dtype -> what the exported checkpoint must say it is.
QUANT_ALGO: dict[str, str | None] = {
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "w4a8_awq": "W4A8_AWQ",
    "nvfp4": "NVFP4",
    "full_prec": None,
}
KV_CACHE_QUANT_ALGO: dict[str | None, str | None] = {"fp8": "FP8", "int8": "INT8", None: None}
AWQ_QFORMATS = ("int4_awq", "w4a8_awq")
# TensorRT-LLM's quantize.py lowers an AWQ --calib_size above this to it, for speed
# (tensorrt_llm/quantization/quantize_by_modelopt.py quantize_and_export). This driver does
# not: it calibrates on every sample it is asked for, so the recipe's `samples` (in the key)
# is what was done. A recipe that wants TRT-LLM's speed asks for 32.
TRTLLM_AWQ_CALIB_CAP = 32

# An INT8 KV cache uses the same K/V quantizers as modelopt's FP8_KV_CFG, with 8-bit integers.
_INT8_KV_CFG = {"*[kv]_bmm_quantizer": {"num_bits": 8, "axis": None, "enable": True}}
# Hugging Face model_type -> modelopt's TRT-LLM decoder_type, where they differ.
DECODER_TYPE = {"mistral": "llama", "mixtral": "llama", "qwen2": "qwen", "qwen3": "qwen"}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
_MAX_MESSAGE = 600


class QuantizerError(Exception):
    """Why a quantization failed, in one line."""


@dataclass(frozen=True)
class Options:
    model_dir: Path
    output_dir: Path
    dtype: str
    qformat: str
    kv_cache_dtype: str | None
    calib_dataset: str
    calib_size: int
    calib_max_seq_length: int
    batch_size: int
    awq_block_size: int
    tp_size: int
    pp_size: int
    export_format: str
    traceback: bool


@dataclass(frozen=True)
class Calibration:
    texts: tuple[str, ...]
    name: str  # the file's name, or the dataset's
    sha256: str  # of the file's bytes, or of the canonical JSON of the texts used


# --- command line ---------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Quantize a Hugging Face checkpoint with NVIDIA modelopt.",
        allow_abbrev=False,
    )
    parser.add_argument("--model_dir", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--dtype", choices=DTYPES, default="auto")
    parser.add_argument("--qformat", choices=QFORMATS, default="full_prec")
    parser.add_argument("--kv_cache_dtype", choices=KV_CACHE_DTYPES, default=None)
    parser.add_argument("--calib_dataset", default="cnn_dailymail")
    parser.add_argument("--calib_size", type=_positive, default=512)
    parser.add_argument("--calib_max_seq_length", type=_positive, default=512)
    parser.add_argument("--batch_size", type=_positive, default=1)
    parser.add_argument("--awq_block_size", type=_positive, default=128)
    parser.add_argument("--tp_size", type=_positive, default=None)
    parser.add_argument("--pp_size", type=_positive, default=None)
    parser.add_argument("--export_format", choices=EXPORT_FORMATS, default="tensorrt_llm")
    parser.add_argument("--traceback", action="store_true", help="show the stack on failure")
    return parser


def parse_args(argv: list[str]) -> Options:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.export_format == "hf" and (ns.tp_size or 1) * (ns.pp_size or 1) != 1:
        parser.error("--export_format hf writes one unsharded checkpoint: drop --tp_size/--pp_size")
    return Options(
        model_dir=ns.model_dir, output_dir=ns.output_dir, dtype=ns.dtype, qformat=ns.qformat,
        kv_cache_dtype=ns.kv_cache_dtype, calib_dataset=ns.calib_dataset,
        calib_size=ns.calib_size, calib_max_seq_length=ns.calib_max_seq_length,
        batch_size=ns.batch_size, awq_block_size=ns.awq_block_size, tp_size=ns.tp_size or 1,
        pp_size=ns.pp_size or 1, export_format=ns.export_format, traceback=ns.traceback,
    )


# --- calibration data -----------------------------------------------------------------------


def read_calibration_file(path: Path) -> Calibration:
    """Texts from a `.jsonl` file ({"text": ...} per line) or a plain file (one per line)."""
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise QuantizerError(f"calibration file {str(path)!r} is not UTF-8 text") from exc
    texts: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            texts.append(line)
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise QuantizerError(
                f"calibration file {str(path)!r} line {number} is not JSON: {exc}"
            ) from exc
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text:
            raise QuantizerError(
                f"calibration file {str(path)!r} line {number} has no non-empty \"text\" string"
            )
        texts.append(text)
    if not texts:
        raise QuantizerError(f"calibration file {str(path)!r} has no text")
    return Calibration(tuple(texts), path.name, hashlib.sha256(data).hexdigest())


def load_named_dataset(dataset: str, size: int) -> Calibration:
    """A dataset by name through the `datasets` library (needs it and the network)."""
    hint = "pass a local .jsonl or text file to --calib_dataset"
    try:
        import datasets
    except ImportError:
        raise QuantizerError(
            f"--calib_dataset {dataset!r} is not a local file and the `datasets` library is not "
            f"installed: {hint}"
        ) from None
    config, column = ("3.0.0", "article") if "cnn_dailymail" in dataset else (None, "text")
    try:
        rows = datasets.load_dataset(dataset, config, split=f"train[:{size}]")[column]
    except Exception as exc:  # hub, network and format errors share no base class
        raise QuantizerError(
            f"cannot load calibration dataset {dataset!r} ({type(exc).__name__}: "
            f"{_one_line(exc)}): {hint}"
        ) from exc
    texts = tuple(str(t) for t in rows if str(t).strip())
    if not texts:
        raise QuantizerError(f"calibration dataset {dataset!r} has no text")
    digest = hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
    return Calibration(texts, dataset, digest)


def load_calibration(dataset: str, size: int) -> Calibration:
    """--calib_dataset: a local file when one is there, else a dataset's name."""
    path = Path(dataset)
    if path.is_file():
        return read_calibration_file(path)
    if path.is_dir():
        raise QuantizerError(f"--calib_dataset {dataset!r} is a directory, not a file")
    if path.suffix in (".jsonl", ".json", ".txt") or os.sep in dataset:
        raise QuantizerError(f"calibration file {dataset!r} does not exist")
    return load_named_dataset(dataset, size)


def calibration_samples(calibration: Calibration, size: int) -> list[str]:
    """*size* texts, cycling through the calibration set when it has fewer."""
    texts = calibration.texts
    return [texts[i % len(texts)] for i in range(size)]


# --- checks before the work (pure) ----------------------------------------------------------


def check_awq_shapes(config: dict[str, Any], block: int, tp_size: int) -> None:
    """Each rank's in_features must be a multiple of the AWQ block, or the export fails.

    Column-parallel layers (q/k/v, gate/up) keep hidden_size inputs; row-parallel ones (o_proj,
    down_proj) get heads × head_dim and intermediate_size split over tp.
    """
    text = config.get("text_config", config)
    try:
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or hidden // heads)
        intermediate = int(text["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return  # not a shape this check knows; the exporter has the last word
    for layer, width in (("q/k/v and gate/up", hidden), ("o_proj", heads * head_dim // tp_size),
                         ("down_proj", intermediate // tp_size)):
        if width % block:
            raise QuantizerError(
                f"--awq_block_size {block} does not divide the {width} input features of "
                f"{layer} (per rank at tp {tp_size}); use a block that divides {width}, "
                "such as 64, or a smaller tp"
            )


# --- checks on what was written (pure over files) --------------------------------------------


def source_rope_theta(model_dir: Path) -> float | None:
    """The source config's `rope_theta` (top level, text_config or rope_parameters)."""
    config = _read_json(model_dir / "config.json")
    for section in (config, config.get("text_config")):
        if not isinstance(section, dict):
            continue
        for holder in (section, section.get("rope_parameters")):
            if isinstance(holder, dict) and isinstance(holder.get("rope_theta"), int | float):
                return float(holder["rope_theta"])
    return None


def validate_trtllm_checkpoint(
    out: Path, *, qformat: str, kv_cache_dtype: str | None, tp_size: int, pp_size: int,
    rope_theta: float | None, awq_block_size: int,
) -> dict[str, Any]:
    """Raise QuantizerError unless *out* is the TRT-LLM checkpoint that was asked for."""
    config = _read_json(out / "config.json")
    world = tp_size * pp_size
    want = {f"rank{n}.safetensors" for n in range(world)}
    found = {p.name for p in out.glob("rank*.safetensors")}
    if found != want:
        raise QuantizerError(
            f"{out}: expected {', '.join(sorted(want))} for tp {tp_size} × pp {pp_size}, "
            f"found {', '.join(sorted(found)) or 'none'}"
        )
    for name in sorted(want):
        _check_safetensors(out / name)
    quantization = config.get("quantization") or {}
    _expect(out, "quantization.quant_algo", quantization.get("quant_algo"), QUANT_ALGO[qformat])
    _expect(out, "quantization.kv_cache_quant_algo", quantization.get("kv_cache_quant_algo"),
            KV_CACHE_QUANT_ALGO[kv_cache_dtype])
    if qformat in AWQ_QFORMATS:
        _expect(out, "quantization.group_size", quantization.get("group_size"), awq_block_size)
    mapping = config.get("mapping") or {}
    _expect(out, "mapping.tp_size", mapping.get("tp_size"), tp_size)
    _expect(out, "mapping.pp_size", mapping.get("pp_size"), pp_size)
    _expect(out, "mapping.world_size", mapping.get("world_size"), world)
    if rope_theta is not None:
        rotary_base = config.get("rotary_base")
        if not isinstance(rotary_base, int | float) or float(rotary_base) != rope_theta:
            raise QuantizerError(
                f"{out / 'config.json'}: rotary_base is {rotary_base!r} but the source model's "
                f"rope_theta is {rope_theta!r}; the exporter lost the RoPE base (modelopt with "
                "an unsupported transformers?), so the checkpoint would generate garbage"
            )
    return config


def validate_hf_checkpoint(
    out: Path, *, qformat: str, kv_cache_dtype: str | None, rope_theta: float | None
) -> dict[str, Any]:
    """Raise QuantizerError unless *out* is the unified HF checkpoint that was asked for."""
    config = _read_json(out / "config.json")
    if rope_theta is not None and source_rope_theta(out) != rope_theta:
        raise QuantizerError(
            f"{out / 'config.json'}: rope_theta is {source_rope_theta(out)!r} but the source "
            f"model's is {rope_theta!r}; the export lost the RoPE base"
        )
    if not any(out.glob("*.safetensors")):
        raise QuantizerError(f"{out}: no .safetensors weights were written")
    for path in sorted(out.glob("*.safetensors")):
        _check_safetensors(path)
    quantization = _read_json(out / "hf_quant_config.json").get("quantization") or {}
    _expect(out, "hf_quant_config.json quant_algo", quantization.get("quant_algo"),
            QUANT_ALGO[qformat])
    _expect(out, "hf_quant_config.json kv_cache_quant_algo",
            quantization.get("kv_cache_quant_algo"), KV_CACHE_QUANT_ALGO[kv_cache_dtype])
    quantization_config = config.get("quantization_config")
    if not isinstance(quantization_config, dict):
        raise QuantizerError(f"{out / 'config.json'} has no quantization_config")
    _expect(out, "config.json quantization_config.quant_method",
            quantization_config.get("quant_method"), "modelopt")
    _expect(out, "config.json quantization_config.quant_algo",
            quantization_config.get("quant_algo"), QUANT_ALGO[qformat])
    return config


def _expect(out: Path, field: str, got: object, want: object) -> None:
    if got != want:
        raise QuantizerError(f"{out}: {field} is {got!r}, expected {want!r}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QuantizerError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise QuantizerError(f"cannot read {path}: {_one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise QuantizerError(f"{path} is not a JSON object")
    return data


def _check_safetensors(path: Path) -> None:
    """The file starts with a readable safetensors header naming at least one tensor."""
    with path.open("rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        size = path.stat().st_size
        header = handle.read(length) if 0 < length <= size - 8 else b""
    try:
        tensors = [k for k in json.loads(header) if k != "__metadata__"] if header else []
    except ValueError:
        tensors = []
    if not tensors:
        raise QuantizerError(f"{path} is not a safetensors file with tensors")


# --- the work -------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


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
        print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
