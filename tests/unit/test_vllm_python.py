"""vLLM's Python is looked for in one order (pipeline.host.runtimes.vllm_pythons), which
builds and smoke runs (Settings) and a deploy node's runtime search (pipeline.deploy.runtime)
both follow: ENGINECTL_VLLM_PYTHON alone when set, else scripts/install-vllm's venv when its
python exists, then python3 and python on PATH."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.deploy.runtime import find_runtime
from pipeline.errors import RuntimeMissingError
from pipeline.host.runtimes import VllmPython, vllm_pythons
from pipeline.settings import Settings


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "vllm-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # has no vllm
    python.chmod(0o755)
    return venv


def test_the_variable_alone_when_set(tmp_path: Path) -> None:
    env = {"ENGINECTL_VLLM_PYTHON": "/opt/vllm/bin/python",
           "ENGINECTL_VLLM_VENV": str(_venv(tmp_path))}
    assert vllm_pythons(env) == [VllmPython("/opt/vllm/bin/python", "ENGINECTL_VLLM_PYTHON")]
    assert Settings.from_env({**env, "HOME": str(tmp_path)}).vllm_python == \
        "/opt/vllm/bin/python"


def test_the_venv_before_path_and_python3_last(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    env = {"ENGINECTL_VLLM_VENV": str(venv), "HOME": str(tmp_path)}
    assert vllm_pythons(env) == [VllmPython(str(venv / "bin" / "python"), str(venv)),
                                 VllmPython("python3", "PATH"), VllmPython("python", "PATH")]
    assert Settings.from_env(env).vllm_python == str(venv / "bin" / "python")
    gone = {"ENGINECTL_VLLM_VENV": str(tmp_path / "none"), "HOME": str(tmp_path)}
    assert [p.python for p in vllm_pythons(gone)] == ["python3", "python"]
    assert Settings.from_env(gone).vllm_python == "python3"


def test_a_deploy_node_takes_the_first_that_has_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here none has vllm (the venv's python fails, the test venv has no vllm): the one
    error names every place looked at, in the order looked."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    venv = _venv(tmp_path)
    with pytest.raises(RuntimeMissingError, match=(
            f"looked at ENGINECTL_VLLM_PYTHON, {re.escape(str(venv))}, and python3 and python "
            "on PATH")):
        find_runtime("vllm", env={"ENGINECTL_VLLM_VENV": str(venv)})
