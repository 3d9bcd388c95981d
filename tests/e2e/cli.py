"""`enginectl` as a user runs it in the end-to-end tests (a fresh process from the repository
root, offline, with its own home) and the one-line error a bad input must give."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import ROOT

GOOD_RECIPE = Path("recipes") / "llama70b-h100.yaml"
PREFIX = "enginectl: error: "


def env_for(home: Path) -> dict[str, str]:
    """This environment, offline, with *home* as enginectl's home and no work directory."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENGINECTL_HOME": str(home)}
    env.pop("ENGINECTL_WORK_DIR", None)
    return env


def enginectl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI as a fresh process runs it (through this worker's fork server,
    tests/cli_forkserver.py), from the repository root, with `env_for(home)`.
    `python -m pipeline.cli` is the same entry point (test_python_m_pipeline_cli_runs_it)."""
    return run_cli([ENGINECTL, *args], cwd=ROOT, env=env_for(home), timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(PREFIX)
    return lines[0]
