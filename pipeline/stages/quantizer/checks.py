"""What the quantizer checks before the work (AWQ group shapes) and on what it wrote (the
ranks, the quantization algorithms, the mapping, `rotary_base`). Pure over files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.stages.quantizer.options import (
    AWQ_QFORMATS,
    KV_CACHE_QUANT_ALGO,
    QUANT_ALGO,
    QuantizerError,
    one_line,
)

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
        raise QuantizerError(f"cannot read {path}: {one_line(exc)}") from exc
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


