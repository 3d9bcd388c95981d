"""The quantizer's flags (a subset of TensorRT-LLM's quantize.py, spelled the same), the
constants they name, and the calibration text (a local file or a named dataset)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

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


def one_line(exc: object) -> str:
    """*exc*'s text on one line, at most _MAX_MESSAGE characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


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
            f"{one_line(exc)}): {hint}"
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


