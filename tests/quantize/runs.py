"""Running the modelopt driver as the plan runs it: `python -m pipeline.stages.quantizer` in a
subprocess with the argv `pipeline.stages.quantize.quantize_argv` emits, the Hub off."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.recipe.schema import Calibration
from pipeline.stages.quantize import Export, QuantizeSpec, quantize_argv
from tests.helpers import RECIPES, ROOT
from tests.models import offline_env

CALIB_FILE = RECIPES / "calibration" / "tiny.jsonl"
CLI_DATA = ROOT / "tests" / "data" / "cli"
CALIB_DIGEST = "sha256:ea0b824c6c8ec24032650dc017cf54f96e261291c4312014c3e877adc3a8ec7c"
TIMEOUT_S = 600  # a guard against a hung quantizer, not a timing assertion


@dataclass(frozen=True)
class QuantizerRun:
    argv: list[str]
    returncode: int
    stderr: str
    output_dir: Path

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("quantizer: error:")]


RunQuantizer = Callable[..., QuantizerRun]


def quantizer_argv(
    model_dir: Path, output_dir: Path, *, quant: str = "fp8", kv_cache_dtype: str = "auto",
    export: Export = "trtllm", tp: int = 1, pp: int = 1, awq_block_size: int = 128,
    calib_path: Path = CALIB_FILE, dataset: str | None = None, samples: int = 16,
) -> list[str]:
    """The plan's argv; *dataset* asks for a named calibration dataset instead of the file."""
    sizes = {"samples": samples, "seq_len": 64, "batch_size": 4}
    calibration = (
        Calibration(dataset=dataset, **sizes) if dataset is not None
        else Calibration(file="calibration/tiny.jsonl", digest=CALIB_DIGEST, **sizes)
    )
    spec = QuantizeSpec(
        dtype="bfloat16",
        quant=quant,  # type: ignore[arg-type]  # tests pass the recipe's literal strings
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
        calibration=calibration, calib_path=None if dataset else calib_path,
        awq_block_size=awq_block_size, export=export, tp=tp, pp=pp,
    )
    return quantize_argv(sys.executable, spec, model_dir=model_dir, output_dir=output_dir)


def run_argv(argv: list[str], output_dir: Path) -> QuantizerRun:
    proc = subprocess.run(
        argv, cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
        check=False,
    )
    return QuantizerRun(argv, proc.returncode, proc.stderr, output_dir)
