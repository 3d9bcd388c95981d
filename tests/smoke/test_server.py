"""Server always stops its whole process group: on success, on an exception, on Ctrl-C,
when the program ignores SIGTERM, and through stop_all."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

from pipeline.serving.server import Server, stop_all
from tests.processes import TAG, tagged_processes

# A leader that ignores SIGTERM and starts a child that ignores it too, then says so. The
# marker is printed in two parts so the argv line at the top of the log does not contain it.
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child\", \"up\", flush=True); "
    "time.sleep(600)'])\n"
    "time.sleep(600)\n"
)
POLITE = "import time; print('server', 'up', flush=True); time.sleep(600)"


def group_exists(pgid: int) -> bool:
    """A process of the group is still running. Zombies (killed grandchildren that init has
    not reaped yet, which can take seconds in a container) hold nothing and do not count."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, _ppid, pgrp = stat[stat.rfind(")") + 2:].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                return True
    return False


def wait_for_log(path: Path, marker: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while marker not in path.read_text():
        assert time.monotonic() < deadline, f"{marker!r} never appeared in {path}"
        time.sleep(0.05)


def test_the_group_is_gone_after_the_block(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with Server([sys.executable, "-c", POLITE], log_path=log) as server:
        pgid = server.pid
        wait_for_log(log, "server up")
        assert server.poll() is None
        assert group_exists(pgid)
    assert not group_exists(pgid)
    assert server.poll() == -15
    assert log.read_text().endswith("enginectl: server stopped (exit code -15)\n")


@pytest.mark.parametrize("error", [RuntimeError("a check blew up"), KeyboardInterrupt()])
def test_the_group_is_gone_after_an_exception_in_the_block(
    tmp_path: Path, error: BaseException
) -> None:
    log = tmp_path / "server.log"
    pgid = 0
    with pytest.raises(type(error)), Server([sys.executable, "-c", POLITE],  # noqa: PT012
                                            log_path=log) as server:
        pgid = server.pid
        wait_for_log(log, "server up")
        raise error
    assert pgid
    assert not group_exists(pgid)


def test_a_group_that_ignores_sigterm_is_killed_children_too(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with Server([sys.executable, "-c", STUBBORN], log_path=log, grace_s=0.2) as server:
        pgid = server.pid
        wait_for_log(log, "child up")
    assert not group_exists(pgid)
    assert server.poll() == -9


def test_env_adds_to_the_environment(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    code = ("import os, time; print('seen', os.environ['SMOKE_TEST_KNOB'], "
            "'PATH' in os.environ, flush=True); time.sleep(600)")
    tag = uuid.uuid4().hex
    with Server([sys.executable, "-c", code], log_path=log,
                env={"SMOKE_TEST_KNOB": "on", TAG: tag}) as server:
        wait_for_log(log, "seen on True")
        # the program, and the runner's guard that leads its group (it has the same env)
        assert server.pid in tagged_processes(tag)
    assert tagged_processes(tag) == []


def test_stop_all_stops_every_live_server(tmp_path: Path) -> None:
    servers = [Server([sys.executable, "-c", POLITE], log_path=tmp_path / f"{i}.log")
               for i in range(2)]
    try:
        for server in servers:
            server.start()
        for i in range(2):
            wait_for_log(tmp_path / f"{i}.log", "server up")
        stop_all()
        assert [server.poll() for server in servers] == [-15, -15]
        assert not any(group_exists(server.pid) for server in servers)
    finally:
        for server in servers:
            server.stop()
    stop_all()  # nothing left: a no-op
