"""An artifact's server as a process (DESIGN §7): started from its manifest's argv template,
awaited until it generates, always stopped.

    with serving(argv_template, model_dir=..., served_name=..., settings=recipe.smoke,
                 log_path=...) as ready:
        ...  # ready.client talks to it; ready.ready_s is its cold start

The server runs from its argv template (`{model_dir}` and `{port}` filled in here) on a free
loopback port, in its own process group started by the process runner (whose guard ends it with
enginectl, even on `kill -9`), logging to *log_path*. It is ready when a real generation
succeeds (a 200 from /health alone proves nothing); a start that lost its port to another
process is tried again on another. It is always stopped, the whole group, SIGTERM then
SIGKILL, whatever happens, Ctrl-C while it starts included. `stop_all` stops every server
still running. pipeline.serving.smoke runs the checks and the load on what this starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from pipeline.host.runner import Process, log_tail, start_process
from pipeline.recipe.schema import SmokeSettings
from pipeline.serving.loadgen import TRANSPORT_ERRORS, Client

HOST: Final = "127.0.0.1"
# A smoke server holds nothing worth a long graceful exit: SIGTERM, then after a second
# SIGKILL the whole group (which frees GPU memory as surely). vLLM's CPU build takes ~2 s to
# exit on SIGTERM, which would otherwise be most of a smoke run's own overhead.
STOP_GRACE_S: Final = 1.0
READY_POLL_S: Final = 0.5
# Answers that are neither a success nor "503 still loading" before readiness gives up: a server
# that is up but cannot generate (healthy, then fails its first request) is not waited out.
READY_FAILURES: Final = 3
# free_port finds a port free, and the server binds it a moment later: on a busy machine another
# process can take it in between. That is the machine's doing, never the artifact's: the start
# is tried again on another port, up to PORT_TRIES times.
PORT_TRIES: Final = 3
PORT_TAKEN: Final = re.compile(r"address already in use|\[Errno 98\]|EADDRINUSE", re.IGNORECASE)

# A log line that is an exception (after vLLM's "(Worker pid=N) ERROR ... [file:line]" prefix):
# the first one in a failed server's log is usually the root cause.
_EXCEPTION_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s+)?(?:ERROR\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s+)?"
    r"((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception): .+)$")

_live: set[Server] = set()
_live_lock = threading.Lock()


def free_port() -> int:
    """A TCP port free on the loopback interface now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def render_argv(template: Sequence[str], *, model_dir: Path, port: int) -> list[str]:
    """*template* with `{model_dir}` and `{port}` filled in (anywhere inside an argument)."""
    return [part.replace("{model_dir}", str(model_dir)).replace("{port}", str(port))
            for part in template]


def stop_all() -> None:
    """Stop every smoke server still running (Ctrl-C, or the executor giving up)."""
    with _live_lock:
        running = list(_live)
    for server in running:
        server.stop()


class Server:
    """A server process in its own process group, logging to *log_path*, started and stopped
    through the process runner (so it dies with enginectl, even on SIGKILL); a context
    manager that always stops the whole group on exit. *env* adds to (overrides)
    os.environ; *cwd* is its working directory (None: this one)."""

    def __init__(self, argv: Sequence[str], *, log_path: Path,
                 env: Mapping[str, str] | None = None, grace_s: float = STOP_GRACE_S,
                 cwd: Path | None = None) -> None:
        self.argv = [str(part) for part in argv]
        self.log_path = log_path
        self.env = dict(env or {})
        self.cwd = cwd
        self.grace_s = grace_s
        self.started_at = 0.0
        self._log_offset = 0  # where this start's lines begin in the log (it is appended to)
        self._process: Process | None = None
        self._stopped = False
        self._stop_lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The leader's pid, which is also the group's id."""
        if self._process is None:
            raise RuntimeError("the server has not been started")
        return self._process.pid

    def start(self) -> None:
        """Start the process; OSError when it cannot be (no such program)."""
        with contextlib.suppress(OSError):
            self._log_offset = self.log_path.stat().st_size
        self._process = start_process(self.argv, log_path=self.log_path,
                                      env={**os.environ, **self.env}, cwd=self.cwd)
        self.started_at = self._process.started_at
        with _live_lock:
            _live.add(self)

    def poll(self) -> int | None:
        """The exit code once the leader has exited, else None."""
        return None if self._process is None else self._process.poll()

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to *timeout_s* for the leader to exit; its exit code, or None."""
        return None if self._process is None else self._process.wait(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def first_exception(self) -> str | None:
        """The first exception line of this start's part of the log (its root cause,
        usually), shortened."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read(4 << 20).decode("utf-8", errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if match := _EXCEPTION_LINE.match(line.strip()):
                found = match.group(1)
                return found if len(found) <= 300 else found[:299] + "…"
        return None

    def stop(self) -> None:
        """Stop the whole group (the runner's `stop_group`: SIGTERM, SIGKILL after grace_s)
        and note it in the log. Once only."""
        process = self._process
        with self._stop_lock:
            if process is None or self._stopped:
                return
            self._stopped = True
        try:
            code = process.stop(self.grace_s)
        finally:
            with _live_lock:
                _live.discard(self)
        with contextlib.suppress(OSError), self.log_path.open("ab") as log:
            log.write(f"\nenginectl: server stopped (exit code {code})\n".encode())

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


# --- readiness --------------------------------------------------------------------------------


class NotReadyError(Exception):
    """The server exited, timed out, or answered without generating before it was ready."""

    def __init__(self, reason: str, log_tail: str, cause: str | None = None, *,
                 argv: Sequence[str], started: bool = True) -> None:
        self.reason = reason if cause is None else f"{reason}; the log says: {cause}"
        self.log_tail = log_tail
        self.cause = cause
        self.argv = list(argv)  # the server's
        self.started = started  # False: the program could not be started at all (OSError)
        super().__init__(self.reason)


def wait_ready(server: Server, client: Client, served_name: str, *, timeout_s: float,
               poll_s: float = READY_POLL_S) -> float:
    """Poll until a one-token completion succeeds; the seconds from start (cold start).
    Raises NotReadyError at once when the process exits, after READY_FAILURES answers that are
    errors (503 excepted), or when *timeout_s* passes."""
    body = {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    deadline = server.started_at + timeout_s
    failures, last, answered = 0, "no answer yet", None  # answered: the last HTTP answer

    def seen() -> str:
        return f"last answer: {answered}" if answered else f"last probe: {last}"

    while True:
        code = server.poll()
        if code is not None:
            raise NotReadyError(f"the server exited with code {code} before it was ready "
                                f"({seen()})", server.log_tail(), server.first_exception(),
                                argv=server.argv)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NotReadyError(f"not ready after {timeout_s:g} s ({seen()})",
                                server.log_tail(), server.first_exception(), argv=server.argv)
        try:
            answer = client.post("/v1/completions", body,
                                 timeout_s=min(client.timeout_s, remaining))
        except TRANSPORT_ERRORS as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if answer.ok and answer.choices:
                return time.monotonic() - server.started_at
            last = answered = f"HTTP {answer.status}: {answer.error_text()}"
            failures += answer.status != 503
            if failures >= READY_FAILURES:
                raise NotReadyError(
                    f"the server answers but cannot generate: {answered} (/health says "
                    f"{_health(client)})", server.log_tail(), server.first_exception(),
                    argv=server.argv)
        server.wait(min(poll_s, max(0.0, deadline - time.monotonic())))


def port_taken(exc: NotReadyError) -> bool:
    """Whether the server died because another process took its port first (`PORT_TRIES`)."""
    return PORT_TAKEN.search(f"{exc.cause or ''}\n{exc.log_tail}") is not None


@dataclass(frozen=True, slots=True)
class Ready:
    """A server `serving` started that generates: its process, a client, argv, cold start."""

    server: Server
    client: Client
    argv: list[str]
    ready_s: float


@contextlib.contextmanager
def serving(argv_template: Sequence[str], *, model_dir: Path, served_name: str,
            settings: SmokeSettings, log_path: Path, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[Ready]:
    """*argv_template* served on a free port until it generates (`wait_ready`), then stopped
    as the block ends. A start that lost its port to another process is tried again on
    another (`PORT_TRIES`). NotReadyError, with the last `argv` tried, when it cannot start
    (`started` False) or never becomes ready."""
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        argv = render_argv(argv_template, model_dir=model_dir, port=port)
        client = Client(HOST, port, timeout_s=settings.request_timeout_s)
        server = Server(argv, log_path=log_path, env=env, cwd=cwd)
        try:
            server.start()
        except OSError as exc:
            raise NotReadyError(f"cannot start {argv[0]}: {exc}", "", argv=argv,
                                started=False) from exc
        try:
            ready_s = wait_ready(server, client, served_name, timeout_s=settings.ready_timeout_s)
        except BaseException as exc:  # Ctrl-C while it starts stops it too
            server.stop()
            if isinstance(exc, NotReadyError) and port_taken(exc) and attempt < PORT_TRIES:
                continue
            raise
        try:
            yield Ready(server, client, argv, ready_s)
        finally:
            server.stop()
        return


def _health(client: Client) -> str:
    try:
        return f"HTTP {client.get('/health', timeout_s=5).status}"
    except TRANSPORT_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"
