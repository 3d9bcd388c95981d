"""Tiny models for the tests that run real libraries, made offline.

    offline_env()               this environment with the Hub, datasets and transformers offline
    unavailable(reason, what)   skip, or fail under CI=true (*what* is required there)
    require(names, what)        `unavailable` unless every library in *names* is importable
    make_tiny_model(out, ...)   scripts/make_tiny_model.py's Llama at *out*, in a subprocess

Fixtures that build a model once (tests/quantize, tests/smoke) and the deploy test that builds
its own call these; no test imports another's fixture.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

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


def make_tiny_model(out: Path, *extra: str) -> Path:
    """scripts/make_tiny_model.py's Llama (hidden 128, head_dim 64 unless *extra* says)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(out), *extra],
        cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=MODEL_TIMEOUT_S,
        check=False)
    assert proc.returncode == 0, f"make_tiny_model.py failed:\n{proc.stderr}"
    return out
