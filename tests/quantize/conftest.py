"""Fixtures for the quantizer's tests: the tiny Llama, made here, and real quantizer runs.

    tiny_model          (session)  scripts/make_tiny_model.py's Llama in a temp directory;
                                   needs torch, transformers, tokenizers and modelopt
                                   (scripts/install-quantize): every test that uses it skips
                                   without them, and fails instead under CI=true
    run_quantizer                  runs `python -m pipeline.quantizer` with the argv that
                                   pipeline.stages.quantize.quantize_argv emits
    fp8_checkpoint      (session)  one FP8 TRT-LLM export (tp 1) that several tests read

The quantizer always runs as a subprocess, as the plan runs it, with the hub switched off.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from pipeline.recipe import Calibration
from pipeline.stages.quantize import Export, quantize_argv
from tests.helpers import RECIPES, ROOT

CALIB_FILE = RECIPES / "calibration" / "tiny.jsonl"
CLI_DATA = ROOT / "tests" / "data" / "cli"
CALIB_DIGEST = "sha256:ea0b824c6c8ec24032650dc017cf54f96e261291c4312014c3e877adc3a8ec7c"
LIBRARIES = ("torch", "transformers", "tokenizers", "modelopt")
TIMEOUT_S = 600


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the quantizer's libraries are required)")
    pytest.skip(reason)


def offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def require_quantize_libraries() -> None:
    missing = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed; run scripts/install-quantize")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_quantize_libraries()
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(out)],
        cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"make_tiny_model.py failed:\n{proc.stderr}"
    return out


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
    return quantize_argv(
        sys.executable, model_dir=model_dir, output_dir=output_dir, dtype="bfloat16",
        quant=quant,  # type: ignore[arg-type]  # tests pass the recipe's literal strings
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
        calibration=calibration, calib_path=None if dataset else calib_path,
        awq_block_size=awq_block_size, export=export, tp=tp, pp=pp,
    )


def run_argv(argv: list[str], output_dir: Path) -> QuantizerRun:
    proc = subprocess.run(
        argv, cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
        check=False,
    )
    return QuantizerRun(argv, proc.returncode, proc.stderr, output_dir)


@pytest.fixture
def run_quantizer(tmp_path: Path) -> RunQuantizer:
    """Quantize a model into tmp_path/out with quantizer_argv's arguments."""

    def run(model_dir: Path, **kwargs: object) -> QuantizerRun:
        out = tmp_path / "out"
        return run_argv(quantizer_argv(model_dir, out, **kwargs), out)  # type: ignore[arg-type]

    return run


@pytest.fixture(scope="session")
def fp8_checkpoint(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> QuantizerRun:
    out = tmp_path_factory.mktemp("fp8") / "out"
    run = run_argv(quantizer_argv(tiny_model, out, quant="fp8"), out)
    assert run.returncode == 0, run.stderr
    return run
