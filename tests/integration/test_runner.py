"""The process runner with real processes: exit statuses pass through its guard unchanged,
and a child (with its own children) dies with the process that started it, even when that
process is killed with SIGKILL and cannot clean up."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.executors.runner import run_process

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["true"], 0),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -TERM $$"], -signal.SIGTERM),
        (["sh", "-c", "kill -KILL $$"], -signal.SIGKILL),
        (["no-such-program-anywhere"], 127),
    ],
)
def test_the_exit_status_passes_through(tmp_path: Path, argv: list[str], code: int) -> None:
    log = tmp_path / "run.log"
    result = run_process(argv, log_path=log, timeout_s=60)
    assert result.returncode == code
    assert result.argv == tuple(argv)
    text = log.read_text()
    assert text.startswith(f"$ {' '.join(argv)}\n")  # the program's argv, not the guard's
    if code == 127:
        assert "cannot start no-such-program-anywhere" in text


def test_a_timeout_stops_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    script = f"sleep 600 & echo $! > {pidfile}; wait"
    result = run_process(["sh", "-c", script], log_path=tmp_path / "run.log", timeout_s=1)
    assert result.timed_out
    assert result.returncode == -signal.SIGTERM
    assert wait_gone(int(pidfile.read_text()))


def read_fifo(path: Path, timeout_s: float = GONE_TIMEOUT_S) -> str:
    """What a process writes into the FIFO *path*, waiting for it without polling."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        assert readable, f"nothing was written to {path}"
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)


def test_children_die_with_a_builder_killed_by_sigkill(tmp_path: Path) -> None:
    """A builder that runs a stage whose program starts a worker of its own: after
    `kill -9` of the builder, neither the program nor its worker is left running."""
    pids = tmp_path / "pids"
    os.mkfifo(pids)
    builder = textwrap.dedent(f"""
        import sys, threading
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.executors.runner import run_process
        script = "sleep 600 & echo $! $$ > {pids}; wait"
        stage = threading.Thread(target=run_process, args=(["sh", "-c", script],),
                                 kwargs={{"log_path": Path({str(tmp_path / "stage.log")!r}),
                                          "timeout_s": 600}})
        stage.start()
        stage.join()
    """)
    proc = subprocess.Popen([sys.executable, "-c", builder])
    worker, program = (int(word) for word in read_fifo(pids).split())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert wait_gone(program), "the stage program outlived its builder"
        assert wait_gone(worker), "the stage program's worker outlived its builder"
    finally:  # what a failure leaves behind is ours to end
        for pid in (program, worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
