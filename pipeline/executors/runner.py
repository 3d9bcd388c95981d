"""The process runner: every external program enginectl starts goes through `run_process`.

argv lists only (never a shell string), each child in its own process group (so a timeout
or Ctrl-C stops the whole tree), stdout and stderr appended to one log file, and a timeout
per call. On Linux every child runs under `pipeline.executors.guard`, so that it dies with
this process even when this process is killed with SIGKILL (a builder's child must never
outlive its lease). This is the seam where tests put small real programs that honour a
tool's CLI: they are found on PATH (or through ENGINECTL_* locations) like the real ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TERMINATE_GRACE_S: Final = 10.0
CANCEL_GRACE_S: Final = 0.5
"""Ctrl-C: its output is discarded anyway, so SIGKILL follows SIGTERM quickly."""
GUARD: Final = Path(__file__).resolve().with_name("guard.py")
GUARDED: Final = sys.platform.startswith("linux")  # PR_SET_PDEATHSIG is Linux's

_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class ProcessResult:
    argv: tuple[str, ...]
    returncode: int
    log_path: Path
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


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


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after *grace_s*."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_all(grace_s: float = TERMINATE_GRACE_S) -> None:
    """Stop every running child (Ctrl-C, or the executor giving up): SIGTERM each group,
    SIGKILL after *grace_s*."""
    with _live_lock:
        running = list(_live)
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in running:
        _stop_group(proc, grace_s)


def guarded(argv: list[str]) -> list[str]:
    """*argv* run under the guard (see `pipeline.executors.guard`) where Linux offers it."""
    if not GUARDED:
        return argv
    return [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), *argv]


def run_process(
    argv: Sequence[str],
    *,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessResult:
    """Run *argv* to completion (or timeout), logging to *log_path*; never raises for a
    non-zero exit — the caller decides what a failure means."""
    argv = [str(part) for part in argv]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                guarded(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=cwd, env=None if env is None else dict(env), start_new_session=True,
            )
        except OSError as exc:
            log.write(f"cannot start {argv[0]}: {exc}\n".encode())
            return ProcessResult(tuple(argv), 127, log_path, 0.0, False)
        with _live_lock:
            _live.add(proc)
        timed_out = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
            log.write(f"\nenginectl: timed out after {timeout_s:.0f} s; stopped\n".encode())
        except BaseException:
            _stop_group(proc)
            raise
        finally:
            with _live_lock:
                _live.discard(proc)
    return ProcessResult(tuple(argv), proc.returncode, log_path, time.monotonic() - started,
                         timed_out)
