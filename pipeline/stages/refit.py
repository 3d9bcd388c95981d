"""refit: weight-stripped engines (`trtllm-build --strip_plan`) and `trtllm-refit`.

A stripped engine is a plan of megabytes that holds no weights; before it serves, trtllm-refit
puts back the weights of the TensorRT-LLM checkpoint it was built from (TensorRT-LLM 1.2's
tensorrt_llm/commands/refit.py: weights matched by name, a missing refittable weight or a
checkpoint of another architecture refused) and writes a whole engine. That checkpoint, the
build's input, is the engine's refit source: its digest is in the engine's labels
(`refit_source`) and provenance, so gc keeps it and fsck checks it while the engine lives.

Argv and the names shared by the builder (smoke) and the node (pull) are here; running the
program is `refit` (through the process runner, its log kept).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pipeline.errors import StageError
from pipeline.host.runner import log_tail, run_process
from registry.tokenizer import TOKENIZER_DIR, TOKENIZER_FILES

STRIP_FLAG: Final = "--strip_plan"
REFIT_DIR: Final = "refit"  # under a smoke run's work directory: the engine it serves
STRIP_LABEL: Final = "strip_plan"
SOURCE_LABEL: Final = "refit_source"  # the checkpoint digest a stripped engine refits from
PLAN_FRACTION: Final = 60.61e6 / 64.78e9
"""A stripped plan's size over its whole engine's, for `plan`'s estimate: NVIDIA's published
llama2-70b FP8 tp2 sample (examples/sample_weight_stripping/README.md in TensorRT-LLM:
64.78 GB whole, 60.61 MB stripped)."""


def is_stripped(flags: Mapping[str, str]) -> bool:
    """Whether a build with *flags* (`pipeline.stages.build.build_flags`) strips its plan."""
    return flags.get(STRIP_FLAG) == "enable"


def stripped_labels(labels: Mapping[str, Any]) -> bool:
    """Whether an artifact with *labels* is a weight-stripped engine."""
    return labels.get(STRIP_LABEL) is True


def whole_argv(argv: list[str]) -> list[str]:
    """The same trtllm-build without --strip_plan: the whole engine a refit is compared to."""
    return [part for part in argv if part != STRIP_FLAG]


def refit_argv(*, engine_dir: Path, checkpoint_dir: Path, output_dir: Path) -> list[str]:
    return ["trtllm-refit", "--engine_dir", str(engine_dir), "--checkpoint_dir",
            str(checkpoint_dir), "--output_dir", str(output_dir)]


class RefitError(StageError):
    """trtllm-refit failed: its exit, and the tail of its log."""


def refit(engine_dir: Path, checkpoint_dir: Path, output_dir: Path, *, log_path: Path,
          timeout_s: float, key: str = "") -> float:
    """Refit *engine_dir* from *checkpoint_dir* into *output_dir* (made afresh), with the
    engine's tokenizer directory and files beside it (trtllm-refit copies config.json and the
    rank engines only); the seconds it took. RefitError (naming *key*: the engine's stage
    key or digest) with the log's tail when it fails, and *output_dir* is removed."""
    if output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    argv = refit_argv(engine_dir=engine_dir, checkpoint_dir=checkpoint_dir,
                      output_dir=output_dir)
    started = time.monotonic()
    result = run_process(argv, log_path=log_path, timeout_s=timeout_s)
    if not result.ok:
        shutil.rmtree(output_dir, ignore_errors=True)
        why = "timed out" if result.timed_out else f"trtllm-refit exited {result.returncode}"
        raise RefitError("refit", key, why, log_path=log_path, log_tail=log_tail(log_path))
    if (engine_dir / TOKENIZER_DIR).is_dir():
        shutil.copytree(engine_dir / TOKENIZER_DIR, output_dir / TOKENIZER_DIR,
                        dirs_exist_ok=True)
    for name in TOKENIZER_FILES:
        if (engine_dir / name).is_file() and not (output_dir / name).exists():
            shutil.copy2(engine_dir / name, output_dir / name)
    return time.monotonic() - started
