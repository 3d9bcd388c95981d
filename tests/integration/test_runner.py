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
import time
from pathlib import Path

import pytest

from pipeline.host.runner import capture, run_process, start_process
from tests.helpers import GONE_TIMEOUT_S, wait_gone

ROOT = Path(__file__).resolve().parents[2]


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
        from pipeline.host.runner import run_process
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


def test_a_server_started_by_a_process_killed_by_sigkill_dies_with_it(tmp_path: Path) -> None:
    """start_process (smoke's and serve's servers): the server and its worker end when the
    process that started it is killed with SIGKILL while the server runs."""
    pids = tmp_path / "pids"
    os.mkfifo(pids)
    starter = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.host.runner import start_process
        script = "sleep 600 & echo $! $$ > {pids}; wait"
        start_process(["sh", "-c", script], log_path=Path({str(tmp_path / "server.log")!r}))
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", starter])
    worker, server = (int(word) for word in read_fifo(pids).split())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert wait_gone(server), "the server outlived the process that started it"
        assert wait_gone(worker), "the server's worker outlived the process that started it"
    finally:
        for pid in (server, worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_program_dies_with_its_guard_killed_on_its_own(tmp_path: Path) -> None:
    """Ray SIGKILLs a dead worker's direct children, which is the guard alone: the program
    under it must not outlive it (it left a hung trtllm-build running after a node loss)."""
    pids = tmp_path / "pids"
    os.mkfifo(pids)
    with start_process(["sh", "-c", f"echo $$ > {pids}; exec sleep 600"],
                       log_path=tmp_path / "server.log") as server:
        program = int(read_fifo(pids))
        assert program != server.pid  # under the guard
        os.kill(server.pid, signal.SIGKILL)
        try:
            assert wait_gone(program), "the program outlived its guard"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(program, signal.SIGKILL)


def test_signals_sent_to_the_group_reach_the_program_not_the_guard(tmp_path: Path) -> None:
    """serve passes SIGUSR1, SIGUSR2, SIGQUIT ... on to its server's group: the program gets
    them; the guard (which hears of its parent's death by SIGUSR1) neither dies nor kills."""
    log = tmp_path / "server.log"
    code = ("import signal, sys, time\n"
            "def said(number, _frame): print('got', number, flush=True)\n"
            "for number in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):\n"
            "    signal.signal(number, said)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    with start_process([sys.executable, "-c", code], log_path=log) as server:
        wait_for_line(log, "ready")
        for number in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
            server.signal_group(number)
            wait_for_line(log, f"got {int(number)}")
        assert server.poll() is None
        assert server.stop(grace_s=5) == -signal.SIGTERM
    assert log.read_text().count("got ") == 3


def wait_for_line(path: Path, line: str) -> None:
    """Wait (bounded) until *path* has *line*."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while line not in path.read_text().splitlines():
        assert time.monotonic() < deadline, f"{line!r} never appeared in {path}"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("argv", "code", "stdout", "stderr"),
    [
        ([sys.executable, "-c", "print('out'); import sys; print('err', file=sys.stderr)"],
         0, "out\n", "err\n"),
        (["sh", "-c", "echo x; exit 4"], 4, "x\n", ""),
        (["no-such-program-anywhere"], 127, "", "cannot start no-such-program-anywhere"),
    ],
)
def test_capture_returns_what_a_probe_printed(argv: list[str], code: int, stdout: str,
                                              stderr: str) -> None:
    done = capture(argv, timeout_s=60)
    assert (done.returncode, done.stdout, done.timed_out) == (code, stdout, False)
    assert done.stderr.startswith(stderr)


def test_capture_stops_a_probe_that_hangs_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    done = capture(["sh", "-c", f"sleep 600 & echo $! > {pidfile}; echo started; wait"],
                   timeout_s=1)
    assert done.timed_out
    assert done.stdout == "started\n"
    assert wait_gone(int(pidfile.read_text()))


def test_a_server_that_cannot_start_raises_as_popen_would(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        start_process(["no-such-program-anywhere"], log_path=tmp_path / "log")
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        start_process([str(script)], log_path=tmp_path / "log")
