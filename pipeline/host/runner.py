"""The process runner: every external program enginectl starts goes through this module.

    run_process(argv, log_path=..., timeout_s=...)      a tool, to completion or its timeout
    capture(argv, timeout_s=...)                         a short probe: its exit code and output
    start_process(argv, log_path=...)                    a server the caller stops: a `Process`

argv lists only (never a shell string), each child in its own process group (so a timeout,
Ctrl-C or the caller's stop ends the whole tree), and one way of stopping that group
(`stop_group`: SIGTERM, SIGKILL after a grace period, then wait until no process of it is left
running). On Linux every child runs under `pipeline.host.guard`, so that it dies with this
process even when this process is killed with SIGKILL (a builder's child must never outlive
its lease, a smoke server never its build). This is the seam where tests put small real
programs that honour a tool's CLI: they are found on PATH (or through ENGINECTL_* locations)
like the real ones.

The guard asks Linux to tell it when the *thread* that started it ends (that is what
PR_SET_PDEATHSIG watches): a long-running child must be started and stopped by a thread that
outlives it, as `smoke` and `serve` do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from pipeline.host.guard import signal_group

TERMINATE_GRACE_S: Final = 10.0
CANCEL_GRACE_S: Final = 0.5
"""Ctrl-C: its output is discarded anyway, so SIGKILL follows SIGTERM quickly."""
REAP_TIMEOUT_S: Final = 10.0
"""How long a stop waits for the killed group to be gone (init reaps killed grandchildren)."""
GUARD: Final = Path(__file__).resolve().with_name("guard.py")
GUARDED: Final = sys.platform.startswith("linux")  # PR_SET_PDEATHSIG is Linux's

_live: set[Process] = set()
_live_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Ended:
    """How a program ended (127: it could not be started); `ok` when it exited 0 in time."""

    argv: tuple[str, ...]
    returncode: int
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessResult(Ended):
    """A tool run to its end (`run_process`): where its output went, how long it took."""

    log_path: Path
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Captured(Ended):
    """What a probe printed (`capture`)."""

    stdout: str
    stderr: str


def log_tail(path: Path, lines: int = 20) -> str:
    """The last *lines* lines of a log, for one-glance error messages."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --- stopping a process group ------------------------------------------------------------------


def group_running(pgid: int) -> bool:
    """Whether a process of group *pgid* is still running. Zombies do not count: they hold no
    memory, GPU or port, and init reaps killed grandchildren when it gets round to it (seconds,
    in some containers). Without /proc, any member counts."""
    proc = Path("/proc")
    if not proc.is_dir():
        return signal_group(pgid, 0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Poll until no process of the group is left running; give up quietly after
    *timeout_s*."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_running(pgid):
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = TERMINATE_GRACE_S) -> None:
    """Stop the process group *proc* leads: SIGTERM, wait up to *grace_s* for the leader and
    then for the rest of the group (workers it started, or left behind when it exited),
    SIGKILL whatever of the group is left, reap the leader and wait (a bounded while) until no
    process of the group is running. The SIGKILL is sent even when the wait is interrupted (a
    second Ctrl-C). The one way enginectl stops a child."""
    deadline = time.monotonic() + grace_s
    try:
        signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
        _wait_group_gone(proc.pid, deadline - time.monotonic())
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        _wait_group_gone(proc.pid, REAP_TIMEOUT_S)


# --- starting ------------------------------------------------------------------------------------


def guarded(argv: list[str]) -> list[str]:
    """*argv* run under the guard (see `pipeline.host.guard`) where Linux offers it."""
    if not GUARDED:
        return argv
    return [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), *argv]


def _check_program(argv: list[str], env: Mapping[str, str] | None, cwd: Path | None) -> None:
    """Raise what Popen would (FileNotFoundError, PermissionError) for a program that cannot
    be run: under the guard, the failure would otherwise only be an exit status 127."""
    program = argv[0]
    path = (os.environ if env is None else env).get("PATH", os.defpath)
    if "/" in program and cwd is not None:
        program = str(Path(cwd) / program)
    if shutil.which(program, path=path) is not None:
        return
    if "/" in program and Path(program).exists():
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv[0])
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])


def _popen(argv: list[str], *, stdout: int | IO[bytes] | None, stderr: int | IO[bytes] | None,
           env: Mapping[str, str] | None, cwd: Path | None) -> subprocess.Popen[bytes]:
    _check_program(argv, env, cwd)
    return subprocess.Popen(
        guarded(argv), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=cwd,
        env=None if env is None else dict(env), start_new_session=True,
    )


class Process:
    """A child started by `start_process`, leader of its own process group, that the caller
    stops (`stop`, or the end of a `with` block). `stop_all` stops it too."""

    def __init__(self, argv: tuple[str, ...], proc: subprocess.Popen[bytes],
                 log_path: Path | None, started_at: float) -> None:
        self.argv = argv
        self.log_path = log_path
        self.started_at = started_at  # time.monotonic() just before the start
        self._proc = proc
        self._stopped = False
        self._stop_lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The leader's pid (the guard's, under it), which is also the group's id."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        """The exit code once the program has exited (-N: signal N ended it), else None."""
        return self._proc.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait up to *timeout_s* (None: for ever) for the program to exit; its exit code,
        or None."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(None if timeout_s is None else max(0.0, timeout_s))
        return self._proc.poll()

    def signal_group(self, signum: int) -> None:
        """Send *signum* to the whole group (a no-op once it is stopped)."""
        if not self._stopped:
            signal_group(self._proc.pid, signum)

    def stop(self, grace_s: float = TERMINATE_GRACE_S) -> int:
        """Stop the whole group (`stop_group`); the program's exit code. Once only: the group
        id may belong to someone else afterwards, so a second call just waits for it."""
        with self._stop_lock:
            first, self._stopped = not self._stopped, True
        try:
            if first:
                stop_group(self._proc, grace_s)
            return self._proc.wait()
        finally:
            with _live_lock:
                _live.discard(self)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def start_process(argv: Sequence[str], *, log_path: Path | None,
                  env: Mapping[str, str] | None = None,
                  cwd: Path | None = None) -> Process:
    """Start *argv* (a server) and return at once; the caller stops it. Its stdout and stderr
    are appended to *log_path* (after a `$ argv` line), or are this process's own when
    *log_path* is None. *env* is the whole environment (None: this one). Raises OSError
    (FileNotFoundError, PermissionError) when the program cannot be started."""
    argv = [str(part) for part in argv]
    if log_path is None:
        started = time.monotonic()
        proc = _popen(argv, stdout=None, stderr=None, env=env, cwd=cwd)
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            started = time.monotonic()
            proc = _popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    process = Process(tuple(argv), proc, log_path, started)
    with _live_lock:
        _live.add(process)
    return process


def stop_all(grace_s: float = TERMINATE_GRACE_S) -> None:
    """Stop every running child (Ctrl-C, or the executor giving up): SIGTERM each group
    first, then stop each (SIGKILL after *grace_s*)."""
    with _live_lock:
        running = list(_live)
    for process in running:
        process.signal_group(signal.SIGTERM)
    for process in running:
        process.stop(grace_s)


def run_process(
    argv: Sequence[str],
    *,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessResult:
    """Run *argv* to completion (or timeout), logging to *log_path*; never raises for a
    non-zero exit — the caller decides what a failure means. A program that cannot be
    started ends with 127, the reason in the log."""
    argv = [str(part) for part in argv]
    try:
        process = start_process(argv, log_path=log_path, env=env, cwd=cwd)
    except OSError as exc:
        with log_path.open("ab") as log:
            log.write(f"cannot start {argv[0]}: {exc}\n".encode())
        return ProcessResult(tuple(argv), 127, False, log_path=log_path, seconds=0.0)
    timed_out = False
    try:
        if process.wait(timeout_s) is None:
            timed_out = True
            process.stop()
            with log_path.open("ab") as log:
                log.write(f"\nenginectl: timed out after {timeout_s:.0f} s; stopped\n".encode())
    except BaseException:
        process.stop()
        raise
    finally:
        with _live_lock:
            _live.discard(process)
    returncode = process.wait()
    assert returncode is not None  # noqa: S101 - waited for without a timeout
    return ProcessResult(tuple(argv), returncode, timed_out, log_path=log_path,
                         seconds=time.monotonic() - process.started_at)


def capture(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Captured:
    """Run a short probe to completion and return its output as text; never raises. A
    program that cannot be started is exit code 127 with the reason as its stderr; one that
    outlives *timeout_s* is stopped (its whole group) and comes back `timed_out`."""
    argv = [str(part) for part in argv]
    try:
        proc = _popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    except OSError as exc:
        return Captured(tuple(argv), 127, False, stdout="",
                        stderr=f"cannot start {argv[0]}: {exc}")
    timed_out = False
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_group(proc, CANCEL_GRACE_S)
            out, err = proc.communicate()
    except BaseException:
        stop_group(proc, CANCEL_GRACE_S)
        raise
    return Captured(tuple(argv), proc.returncode, timed_out,
                    stdout=out.decode("utf-8", errors="replace"),
                    stderr=err.decode("utf-8", errors="replace"))


def stop_logging_to(log_path: Path, grace_s: float = TERMINATE_GRACE_S) -> int:
    """Stop every running child whose output goes to *log_path* (one stage run's children:
    its log is its own), each whole group as `stop_all` does; how many were stopped."""
    with _live_lock:
        running = [process for process in _live if process.log_path == log_path]
    for process in running:
        process.stop(grace_s)
    return len(running)
