"""Small helpers shared by tests: write a recipe variant and load it."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml

from pipeline.planning.plan import Plan, plan_recipe
from pipeline.recipe.reader import load_recipe
from pipeline.settings import Settings
from tests.cli_forkserver import ENGINECTL, run_cli

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"


def expect_exit(done: subprocess.CompletedProcess[str], code: int | None) -> None:
    """Fail, showing the whole of stdout and stderr (an assertion's repr cuts them), when
    *done* did not exit *code* (None: any code)."""
    if code is not None and done.returncode != code:
        pytest.fail(f"{done.args!r} exited {done.returncode}, expected {code}\n"
                    f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}", pytrace=False)


def enginectl(env: dict[str, str], *args: str | Path, code: int = 0,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `enginectl ARGS` with *env* (from *cwd*); fail unless it exits
    *code*, showing its whole output."""
    done = run_cli([ENGINECTL, *map(str, args)], env=env, timeout=600, cwd=cwd)
    expect_exit(done, code)
    return done


def recipe_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((RECIPES / name).read_text(encoding="utf-8"))
    return data


def plan_of(data: dict[str, Any], directory: Path, filename: str = "recipe.yaml") -> Plan:
    path = directory / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return plan_recipe(load_recipe(path), Settings.from_env({"ENGINECTL_HOME": str(directory)}))


def keys_by_stage(plan: Plan) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for run in plan.stages.values():
        found.setdefault(run.stage, set()).add(run.key)
    return found


STORE_NOTE = "enginectl: note: using store "


def without_store_note(stderr: str) -> str:
    """*stderr* without the note naming the store and registry, which build, import, fetch
    and pull print when their work begins (after their input was checked)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith(STORE_NOTE))


def stderr_of(done: subprocess.CompletedProcess[str]) -> str:
    """A command's stderr without the store and registry note (`without_store_note`)."""
    return without_store_note(done.stderr)


FAKES = ROOT / "tests" / "fakes"


def fake_gpu(directory: Path, name: str = "NVIDIA H100 80GB HBM3", *, count: int = 1,
             driver: str = "570.124.06") -> dict[str, str]:
    """The environment that makes tests/fakes/bin/nvidia-smi report *count* GPUs *name*
    with *driver* (and the CUDA version of that driver's branch): its config file, written
    under *directory* (rewrite it to bump the driver). Without it the stand-in answers as a
    machine whose driver is not loaded."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "nvidia-smi.json"
    config.write_text(json.dumps({"name": name, "count": count, "driver": driver}),
                      encoding="utf-8")
    return {"FAKE_NVIDIA_SMI_CONFIG": str(config)}


def only_nvidia_smi(directory: Path) -> Path:
    """A directory holding the nvidia-smi stand-in alone (a GPU machine without
    TensorRT-LLM's programs), for the front of PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "nvidia-smi"
    if not link.exists():
        link.symlink_to(FAKES / "bin" / "nvidia-smi")
    return directory


# What a test that signals its child needs at the default: a suite started from a job that
# ignores SIGINT or SIGHUP (nohup, `cmd &` in a script, some CI runners) passes the ignored
# signal on to every child, and enginectl keeps it so (a user's `nohup enginectl build`
# means it). SIGPIPE and SIGXFSZ are the two Python itself ignores.
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT,
                   signal.SIGPIPE, signal.SIGXFSZ)
_RESET_THEN_EXEC = (
    "import os, signal, sys\n"
    f"for number in {tuple(int(n) for n in DEFAULT_SIGNALS)}:\n"
    "    signal.signal(number, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def with_default_signals(argv: Sequence[str | Path]) -> list[str]:
    """*argv* started with SIGINT, SIGHUP, SIGTERM, SIGQUIT (and SIGPIPE, SIGXFSZ) at their
    defaults, whatever this test process inherited, for a test that sends it a signal. The
    program replaces a small Python (exec: same pid) that resets them; not `preexec_fn`,
    which is unsafe while the test runs server threads."""
    return [sys.executable, "-I", "-S", "-c", _RESET_THEN_EXEC, *map(str, argv)]


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    return


@contextlib.contextmanager
def children_get_default_signals() -> Iterator[None]:
    """While inside, the programs this process starts get SIGINT, SIGHUP, SIGTERM and SIGQUIT
    at their defaults even when this process ignores them: each ignored one is given a
    do-nothing handler meanwhile (exec resets a handler to the default, where an ignored
    signal stays ignored). For code that starts processes itself (Ray's cluster_utils), where
    `with_default_signals` cannot reach the argv."""
    previous = {number: signal.signal(number, _ignore) for number in DEFAULT_SIGNALS[:4]
                if signal.getsignal(number) == signal.SIG_IGN}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def builder_env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    """The environment of a builder on TensorRT-LLM's stand-ins (tests/fakes) with its own
    home under *tmp_path* and the registry at *registry_url*."""
    return {
        **os.environ,
        "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "ENGINECTL_HOME": str(tmp_path / "home"),
        "ENGINECTL_REGISTRY_URL": registry_url,
        "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
        "ENGINECTL_PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
    }


GONE_TIMEOUT_S = 60  # a guard against a hang, not a timing assertion


def wait_gone(pid: int, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    """Whether process *pid* (not our child) ends within *timeout_s*: woken by the kernel
    through a pidfd when it exits (a zombie has exited too), no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)
