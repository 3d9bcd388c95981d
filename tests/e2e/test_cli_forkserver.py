"""The suite's CLI fork server (tests/cli_forkserver.py) answers as a fresh `enginectl` would:
the same output, exit status, environment, working directory, stdin and timeout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import RECIPES


def fresh(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("args", [
    ["ls"],  # no registry: exit 4, one line on stderr
    ["db", "upgrade"],
    ["ls", "--json"],
    ["--help"],
    ["nonsense"],  # click's usage error: exit 2
    ["plan", "recipe.yaml"],  # relative to the working directory
])
def test_a_forked_run_answers_as_a_fresh_process(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    (tmp_path / "recipe.yaml").write_bytes((RECIPES / "llama70b-h100.yaml").read_bytes())
    forked = run_cli([ENGINECTL, *args], env=env, cwd=tmp_path, timeout=120)
    spawned = fresh([ENGINECTL, *args], env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (spawned.returncode, spawned.stdout, spawned.stderr)


def test_the_environment_is_the_runs_own(tmp_path: Path) -> None:
    """A setting read when the command runs comes from this run's environment, not the
    server's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env["ENGINECTL_REGISTRY_URL"] = "nosuch://x"
    forked = run_cli([ENGINECTL, "ls"], env=env, cwd=tmp_path)
    assert forked.returncode == fresh([ENGINECTL, "ls"], env, tmp_path).returncode != 0
    assert "nosuch://x" in forked.stderr


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_does(tmp_path: Path) -> None:
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path)}
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli([ENGINECTL, "--help"], env=env, timeout=0.001)
