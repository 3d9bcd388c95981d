"""convert: HF checkpoint → TensorRT-LLM checkpoint for (tp, pp, dtype), no quantization.

Runs TensorRT-LLM's own per-family `convert_checkpoint.py` from the release image's examples.
"""

from __future__ import annotations

from pathlib import Path

# architecture family (from config.json's `architectures`) -> examples/models/core/<dir>
FAMILY_DIRS: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "phi3": "phi",
}


def convert_script(examples: Path, family: str) -> Path:
    return examples / "models" / "core" / FAMILY_DIRS.get(family, family) / "convert_checkpoint.py"


def convert_argv(
    python: str,
    examples: Path,
    *,
    family: str,
    model_dir: Path,
    output_dir: Path,
    dtype: str,
    tp: int,
    pp: int,
    workers: int,
) -> list[str]:
    return [
        python, str(convert_script(examples, family)),
        "--model_dir", str(model_dir),
        "--output_dir", str(output_dir),
        "--dtype", dtype,
        "--tp_size", str(tp),
        "--pp_size", str(pp),
        "--workers", str(workers),
    ]
