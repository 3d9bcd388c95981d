"""Run the installed `enginectl` in a fresh process without paying its imports each time.

The suite runs the CLI about 1400 times. Each run is a new Python that spends ~0.4 CPU-s
importing click, SQLAlchemy's ORM, Alembic, boto3 and enginectl before the command starts:
more than a quarter of the suite's CPU on 2 cores. So each pytest worker keeps one server
process (this file, run as a script) that imports all that once, then forks a child per run,
as Android's zygote and Python's own `forkserver` do. The child is a new process running the
console script's function, `pipeline.cli:entry`, with the run's argv, environment, working
directory and standard streams (passed as file descriptors over a Unix socket), every other
descriptor closed, and Python's shutdown (threads joined, atexit, streams flushed); its exit
status comes back as `subprocess.run` reports it. Nothing of the CLI is replaced or skipped.

What a fresh interpreter decides at start-up from the environment cannot change in a forked
child, so `run_cli` keeps one server per interpreter setting (PYTHON*, LANG, LC_*) and falls back
to a plain `subprocess.run` for any other program. enginectl's own modules read the
environment when a command runs, never at import (the Ray executor's module constants are not
preloaded here: they are read when a Ray command imports them, in the child).
Tests of the process itself (signals, Ctrl-C, a parent that dies, which modules a path
imports, the wheel as installed) start it with `subprocess` as before.

    python tests/cli_forkserver.py SOCKET     # the server; `run_cli` starts it
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ENGINECTL = str(Path(sys.executable).parent / "enginectl")
# What a server imports before it forks: the console script's module, then what its commands
# import when they run (each is imported again, for free, by the command).
PRELOAD = (
    "pipeline.cli",
    "sqlalchemy.orm",
    "alembic.command",
    "alembic.config",
    "boto3",
    "registry.sql.models",
    "registry.ops.inventory",
    "registry.ops.publish",
    "registry.ops.fetch",
    "pipeline.planning.plan",
    "sqlite3",
    "sqlalchemy.dialects.sqlite",
    "registry.context",
    "registry.ops.logs",
    "registry.store.opener",
    "registry.store.filestore",
    "registry.ops.adopt",
    "registry.ops.fsck",
    "registry.ops.gc",
    "registry.ops.resolve",
    "pipeline.listings",
    "pipeline.info",
    "pipeline.executors.build",
    "pipeline.serving.smoke_here",
    "pipeline.serving.compare",
    "pipeline.nightly.run",
    "pipeline.nightly.report",
    "pipeline.deploy.pull",
    "pipeline.deploy.serve",
    # what a third or more of the runs imported after the fork (measured over the integration,
    # e2e and deploy tests): PostgreSQL's driver (~50 ms, in every run on PostgreSQL), the S3
    # store's modules, the smoke's and the executors'
    "psycopg",
    "sqlalchemy.dialects.postgresql.psycopg",
    "registry.store.s3store",
    "registry.store.s3get",
    "registry.store.s3splice",
    "registry.sql.warm_lookup",
    "pipeline.serving.smoke",
    "pipeline.executors.preview",
    "pipeline.executors.noop",
    "registry.ops.placement",
    "pipeline.cli.progress",
    "difflib",
    "encodings.idna",
)
# Libraries that read the environment when imported (huggingface_hub's HF_HUB_OFFLINE, Ray's
# and torch's settings): a server that had imported them would hand every run the server's
# values. `serve` checks that the preload left them out.
NEVER_PRELOADED = ("huggingface_hub", "transformers", "torch", "ray", "vllm", "modelopt")
MAX_MESSAGE = 1 << 20
PR_SET_PDEATHSIG = 1


# -- the server -------------------------------------------------------------------------------

def _exit_code(code: object) -> int:
    """The status Python gives `SystemExit(code)` (Python/pythonrun.c, handle_system_exit)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """The forked run: become a fresh `enginectl ARGV` process, run it, exit as Python would."""
    try:
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # as unset in a fresh interpreter: TMPDIR is read on first use
        sys.argv = list(request["argv"])
        from pipeline.cli import entry

        try:
            entry()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 130
        except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught error
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()  # type: ignore[attr-defined] # as Py_FinalizeEx: threads, atexit, flush
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                code = code or 120  # Python's status when flushing stdout fails at exit
    except BaseException:  # noqa: BLE001 - never return into the server's loop
        code = 1
    os._exit(code)


def serve(path: str) -> None:
    """Listen on *path*; for each request (JSON: argv, env, cwd; fds: stdin, stdout, stderr)
    fork a run, answer {"pid": …} at once and {"code": …} when it has ended."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # gone with the pytest worker that started it
    sys.path[0] = str(Path(sys.executable).parent)  # as the console script's own sys.path
    for name in PRELOAD:
        __import__(name)
    early = sorted(set(NEVER_PRELOADED) & {name.split(".")[0] for name in sys.modules})
    if early:
        sys.exit(f"the CLI fork server's preload imported {early}, which read the environment")
    # Keep the preload's objects out of every run's garbage collections: a run's first full
    # collection otherwise walks them all (and writes to every page that holds one), ~0.05 of
    # a short command's ~0.06 CPU-s. A fresh process has no such heap to walk.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ, ("request", conn))
            elif key.data[0] == "request":
                conn = key.data[1]
                selector.unregister(conn)
                message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
                if not message:
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, ("ended", pid, conn))
            else:
                _, pid, conn = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test stopped waiting (its timeout)
                    conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
                conn.close()


# -- the client, in the pytest worker -----------------------------------------------------------

# Settings read when a preloaded module is imported (the interpreter's, the locale's, psycopg's
# PSYCOPG_IMPL and PSYCOPG_WAIT_FUNC): each set of values gets a server of its own.
INTERPRETER_SETTINGS = ("PYTHON", "LANG", "LC_", "PSYCOPG_")
_servers: dict[tuple[tuple[str, str], ...], str] = {}
_starting = threading.Lock()


def _setting(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(INTERPRETER_SETTINGS)))


def _server_for(env: dict[str, str]) -> str:
    """The socket of this worker's server for *env*'s interpreter settings, started once."""
    setting = _setting(env)
    with _starting:
        if setting not in _servers:
            _servers[setting] = _start(setting)
    return _servers[setting]


def _start(setting: tuple[tuple[str, str], ...]) -> str:
    """Start a server with these interpreter settings; the path of its socket."""
    folder = tempfile.mkdtemp(prefix="enginectl-forkserver-")
    path = f"{folder}/socket"
    server_env = {k: v for k, v in os.environ.items()
                  if not k.startswith(INTERPRETER_SETTINGS)} | dict(setting)
    server = subprocess.Popen([sys.executable, __file__, path], env=server_env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the CLI fork server did not start (exit {server.wait()})")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    atexit.register(server.kill)
    return path


def _text(data: bytes) -> str:
    """*data* as `subprocess.run(text=True)` decodes it (its _translate_newlines)."""
    return (data.decode(locale.getpreferredencoding(False))
            .replace("\r\n", "\n").replace("\r", "\n"))


def run_cli(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | str | None = None,
        timeout: float | None = None, input: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, input=input, text=True,
    capture_output=True, check=False)`, through this worker's fork server when argv runs the
    installed enginectl (module doc)."""
    env = dict(os.environ if env is None else env)
    if not argv or str(argv[0]) != ENGINECTL:
        return subprocess.run([str(a) for a in argv], env=env, cwd=cwd, timeout=timeout,
                              input=input, text=True, capture_output=True, check=False)
    argv = [str(a) for a in argv]
    request = {"argv": argv, "env": env, "cwd": str(Path(cwd or Path.cwd()).absolute())}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, \
            tempfile.TemporaryFile() as stderr, \
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        if input is not None:
            stdin.write(input.encode(locale.getpreferredencoding(False)))
            stdin.seek(0)
        conn.connect(_server_for(env))
        socket.send_fds(conn, [json.dumps(request).encode()],
                        [stdin.fileno(), stdout.fileno(), stderr.fileno()])
        pid = json.loads(conn.recv(MAX_MESSAGE))["pid"]
        conn.settimeout(timeout)
        try:
            code = json.loads(conn.recv(MAX_MESSAGE))["code"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            stdout.seek(0)
            stderr.seek(0)
            raise subprocess.TimeoutExpired(argv, timeout or 0, stdout.read(),
                                            stderr.read()) from None
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(argv, code, _text(stdout.read()), _text(stderr.read()))


if __name__ == "__main__":
    serve(sys.argv[1])
