"""`nightly --notify`: a malformed URL is refused before the run (one line naming --notify and
the value, exit 2, nothing touched), and a webhook that answers slowly never holds the run:
one deadline for the whole POST (ENGINECTL_NOTIFY_TIMEOUT_S, 10 s by default), then a
one-line warning, and the run's exit code stands."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_forkserver import run_cli
from tests.integration.builds import ENGINECTL, cpu_recipe

GUARD_S = 120  # a guard against a hang, not a timing assertion


def nightly(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        [ENGINECTL, "nightly", *args], timeout=GUARD_S,
        env={**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
             "ENGINECTL_VLLM_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", **env})


@pytest.mark.parametrize("url", [
    "http://[::1",  # an IPv6 literal that is not closed
    "http://hooks.example/x\r\nX-Injected: 1",
    "http://hooks.example/a\nb",
    "",
    "http://hooks.example:99999/x",
    "ftp://hooks.example/x",
    "http:///no-host",
])
def test_a_malformed_notify_url_is_refused_before_the_run(tmp_path: Path, url: str) -> None:
    recipe = cpu_recipe(tmp_path)
    done = nightly(tmp_path, str(recipe), "--notify", url)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"enginectl: error: --notify {url!r}: ")
    assert not (tmp_path / "home").exists()  # nothing touched: not even the registry


def test_a_notify_timeout_that_is_not_seconds_is_refused(tmp_path: Path) -> None:
    done = nightly(tmp_path, str(cpu_recipe(tmp_path)), "--notify", "http://127.0.0.1:9/x",
                   ENGINECTL_NOTIFY_TIMEOUT_S="soon")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        ("enginectl: error: ENGINECTL_NOTIFY_TIMEOUT_S='soon': expected seconds between 0.5 "
        "and 86400, e.g. 120")]


class DripServer:
    """Accepts, reads the request, then answers one byte a second for ten minutes: its
    headers never end."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.stopped = threading.Event()
        self.requests: list[bytes] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._drip, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            self.requests.append(conn.recv(65536))
            answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 600
            for byte in answer:
                if self.stopped.wait(1.0):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.sock.close()
        for thread in self.threads:
            thread.join(GUARD_S)


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer()
    yield server
    server.close()


def test_a_webhook_that_drips_its_answer_never_holds_the_run(
    tmp_path: Path, drip: DripServer
) -> None:
    recipe = cpu_recipe(tmp_path)
    done = nightly(tmp_path, "--dry-run", str(recipe), "--notify", drip.url,
                   ENGINECTL_NOTIFY_TIMEOUT_S="2")
    assert done.returncode == 0, done.stderr  # as without --notify: the dry run's own code
    assert drip.requests
    assert drip.requests[0].startswith(b"POST /hook HTTP/1.1")
    warnings = [line for line in done.stderr.splitlines() if "--notify" in line]
    assert warnings == [(f"enginectl: note: --notify {drip.url}: the POST failed (no answer "
                        "within 2 s); the run's result stands")]
