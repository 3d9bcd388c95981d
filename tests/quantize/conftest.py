"""Fixtures for the quantizer's tests: the tiny Llama, made here, and real quantizer runs.

    tiny_model          (session)  scripts/make_tiny_model.py's Llama in a temp directory;
                                   needs torch, transformers, tokenizers and modelopt
                                   (scripts/install-quantize): every test that uses it skips
                                   without them, and fails instead under CI=true
    run_quantizer                  runs `python -m pipeline.stages.quantizer` with the argv that
                                   pipeline.stages.quantize.quantize_argv emits
    fp8_checkpoint      (session)  one FP8 TRT-LLM export (tp 1) that several tests read

The quantizer always runs as a subprocess, as the plan runs it, with the hub switched off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import make_tiny_model, require
from tests.quantize.runs import QuantizerRun, RunQuantizer, quantizer_argv, run_argv

LIBRARIES = ("torch", "transformers", "tokenizers", "modelopt")


def require_quantize_libraries() -> None:
    require(LIBRARIES, "the quantizer's libraries are")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_quantize_libraries()
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama",
                           factory=tmp_path_factory)


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
