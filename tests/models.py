"""Tiny models for the tests that run real libraries, made offline.

    offline_env()               this environment with the Hub, datasets and transformers offline
    unavailable(reason, what)   skip, or fail under CI=true (*what* is required there)
    require(names, what)        `unavailable` unless every library in *names* is importable
    make_tiny_model(out, ...)   scripts/make_tiny_model.py's Llama at *out* (made once a run)

Fixtures that build a model once (tests/quantize, tests/smoke) and the deploy test that builds
its own call these; no test imports another's fixture.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from registry.filelock import flock
from tests.helpers import ROOT

MODEL_TIMEOUT_S = 600  # a guard against a hung child on a loaded machine, not a timing


@dataclass(frozen=True)
class TinyModels:
    """tests/smoke's session models: the bf16 Llama (head_dim 64) and a head_dim 16 one."""

    bf16: Path
    head_dim_16: Path


def offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def unavailable(reason: str, what: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: {what} required)")
    pytest.skip(reason)


def require(names: Iterable[str], what: str) -> None:
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed; run scripts/install-quantize", what)


def make_tiny_model(out: Path, *extra: str, factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_model.py's Llama (hidden 128, head_dim 64 unless *extra* says) at
    *out*. Made once per test run for each *extra* and copied: the script costs seconds of
    CPU, and fixtures on several xdist workers asked for it up to ~20 times a run. The shared
    copy lives under the run's temporary root (*factory*'s), made whole or not at all, under
    a lock."""
    shared = _run_root(factory) / "tiny-models" / ("-".join(e.strip("-") for e in extra)
                                                    or "default")
    with flock(shared.parent / f"{shared.name}.lock"):  # the others wait for the one making it
        if not shared.is_dir():
            partial = shared.parent / f"{shared.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            proc = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(partial),
                 *extra],
                cwd=ROOT, env=offline_env(), capture_output=True, text=True,
                timeout=MODEL_TIMEOUT_S, check=False)
            assert proc.returncode == 0, f"make_tiny_model.py failed:\n{proc.stderr}"
            partial.rename(shared)
    shutil.copytree(shared, out)
    return out


def _run_root(factory: pytest.TempPathFactory) -> Path:
    """The temporary root of this test run: under pytest-xdist, the one above every worker's
    own (`--basetemp` is ROOT/popen-gwN there)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
