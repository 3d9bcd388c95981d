"""convert: HF checkpoint → TensorRT-LLM checkpoint for (tp, pp, dtype), no quantization.

Runs TensorRT-LLM's own per-family `convert_checkpoint.py` from the release image's examples.
The scripts do not share a command line; each family's argv below was read from its script
in NVIDIA/TensorRT-LLM (1.x era; the exact 1.2.x tag is not in the readable index), and
tests/data/cli/trtllm-<dir>-convert.json records each parser flag for flag:

    llama  examples/models/core/llama/convert_checkpoint.py @ fd96a08bdc48
           `--model_dir --output_dir --dtype --tp_size --pp_size --workers`;
           LLaMAConfig.from_hugging_face (tensorrt_llm/models/llama/config.py @ 89fd9b74ab7a)
           takes LlamaForCausalLM and MistralForCausalLM (mistral3's text config too)
    qwen   examples/models/core/qwen/convert_checkpoint.py @ 65b31db1b401: the same flags;
           QWenConfig.from_hugging_face (tensorrt_llm/models/qwen/config.py @ 373970a88b18)
           takes model_type qwen2 and qwen3 among others
    phi    examples/models/core/phi/convert_checkpoint.py @ 567239fcd40b: the same flags, but
           `assert args.pp_size == 1` ("Pipeline parallelism is not supported.")
    gemma  examples/models/core/gemma/convert_checkpoint.py @ fbbc05dd1445 (same parser at
           310decb9aa6e): `--ckpt-type hf --model-dir --output-model-dir --world-size
           --dtype`; no --workers, and tensor parallelism only: main() builds
           Mapping(world_size, tp_size=world_size, pp_size=1) whatever is asked. Its HF path
           reads config.json's model_type through GemmaConfig.get_hf_config
           (tensorrt_llm/models/gemma/config.py @ 9df6d722b020): gemma, gemma2 and
           gemma3_text (Gemma3ForCausalLM) only.

What a script cannot do is refused at plan time (`unconvertible`), not after a snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

# architecture family (from config.json's `architectures`) -> examples/models/core/<dir>
FAMILY_DIRS: Final[dict[str, str]] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "phi3": "phi",
}
# scripts whose Mapping has pp_size 1 whatever the argv says (module doc)
TP_ONLY: Final = frozenset({"gemma", "phi"})


def convert_script(examples: Path, family: str) -> Path:
    return examples / "models" / "core" / FAMILY_DIRS[family] / "convert_checkpoint.py"


def unconvertible(family: str, pp: int) -> str | None:
    """Why TensorRT-LLM's convert scripts cannot make this checkpoint (None when they can)."""
    if family not in FAMILY_DIRS:
        return (f"TensorRT-LLM has no convert_checkpoint.py enginectl runs for the {family!r} "
                f"family (it converts {', '.join(sorted(FAMILY_DIRS))})")
    directory = FAMILY_DIRS[family]
    if pp > 1 and directory in TP_ONLY:
        return f"TensorRT-LLM's {directory} convert_checkpoint.py has no pipeline parallelism"
    return None


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
    script = str(convert_script(examples, family))
    if FAMILY_DIRS[family] == "gemma":
        return [
            python, script,
            "--ckpt-type", "hf",
            "--model-dir", str(model_dir),
            "--output-model-dir", str(output_dir),
            "--world-size", str(tp),
            "--dtype", dtype,
        ]
    return [
        python, script,
        "--model_dir", str(model_dir),
        "--output_dir", str(output_dir),
        "--dtype", dtype,
        "--tp_size", str(tp),
        "--pp_size", str(pp),
        "--workers", str(workers),
    ]
