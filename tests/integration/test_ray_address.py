"""A Ray address where something listens that is not Ray: a port that accepts and says
nothing, or an HTTP/1 server. Ray itself waits minutes and then ends the process with a page
of log; enginectl asks the port the first question gRPC asks (HTTP/2's preface) and says in
one line, exit 2, that it is not Ray. (A real cluster's GCS and client server answer it:
tests/ray.)"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli

GUARD_S = 60  # a guard against a hang (Ray's own wait is minutes), not a timing assertion


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(GUARD_S)
        for conn in held:
            conn.close()


class Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        return


@contextlib.contextmanager
def http_port() -> Iterator[int]:
    """An HTTP/1 server (a dashboard, a proxy: what a mistyped port often reaches)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


SERVERS = {"silent": (silent_port, "no answer in 10 s"),
           "http": (http_port, "it does not speak gRPC: it answered ")}


@pytest.mark.parametrize("scheme", ["ray://", ""])
@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_an_address_that_is_not_ray_is_one_line_with_exit_2(
    tmp_path: Path, kind: str, scheme: str
) -> None:
    serve, why = SERVERS[kind]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ENGINECTL_"))}
    env |= {"ENGINECTL_HOME": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    with serve() as port:
        address = f"{scheme}127.0.0.1:{port}"
        done = run_cli([ENGINECTL, "fleet", "--address", address], env=env, timeout=GUARD_S)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"enginectl: error: cannot join the Ray cluster at {address!r}: "
                           f"127.0.0.1:{port} is not Ray ({why}"), line
    assert line.endswith("; check --address (or RAY_ADDRESS) and `ray status` on the head")
