"""serve: pull what this node should serve (once; later starts reuse it) and run its server
in the foreground — the one-container experience.

    with Context() as ctx:
        sys.exit(serve(ctx, None, model="llama-3.3-70b-instruct", gpu="auto", port=8000))

The directory is `<home>/serving/<16 hex of the digest>` (or, with `-o DIR`, DIR, taken and
placed as `pull -o DIR` does: `registry.ops.fetch.check_target`): content-addressed, filled
from the fetch cache (hard links, when home and cache share a file system, as they do by
default). A start finds it complete (its `serve.json` names the digest, and every file is
proven as the fetch cache proves its entries: unread while its size, mtime, ctime, inode and
device are those stamped when it was placed or last checked, else re-hashed) and only
rewrites `serve.json` for the host and port asked; otherwise (a file edited in place, even
to the same size, or removed) it is pulled again. The stamps are kept beside it (`.<16
hex>.verified.json`; for `-o DIR` in `<home>/serving/`, so nothing is written beside DIR).
A lock file beside it makes two `serve`s of one digest on a node (replicas sharing a
hostPath) pull it once.

The server runs as a child in its own process group, started by the process runner
(pipeline.host.runner) under its guard. SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 are passed on to that group; when the server exits, whatever it left running in its
group is sent SIGTERM, then SIGKILL after `STOP_GRACE_S`, so nothing outlives `serve`.
enginectl is a child subreaper (Linux), so processes the server orphans are reaped here, as
PID 1 in a container must, and the server's group gets SIGKILL if enginectl dies.
`serve` returns the server's exit code (128 + N when a signal N ended it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

from pipeline.deploy.node import NodeOptions, model_request
from pipeline.deploy.pull import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    Pulled,
    Selection,
    merged,
    place,
    pulled_for,
    select,
)
from pipeline.deploy.runtime import RuntimeExecutable, find_runtime
from pipeline.deploy.warm import WARM_DIR, Warm
from pipeline.host.runner import start_process
from pipeline.planning.capacity import serving_shortfall
from registry.ops.fetch import check_target
from registry.ops.marker import SERVE_FILE, SERVE_SCHEMA, write_json
from registry.store.cache import check_file, file_stamp

if TYPE_CHECKING:
    from registry.context import Context
    from registry.gpus import GpuSpec
    from registry.identity.digest import Digest
    from registry.progress import Progress

FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2)
STOP_GRACE_S: Final = 10.0  # for what the server left in its group to exit on SIGTERM
_PR_SET_CHILD_SUBREAPER: Final = 36


def serving_dir(ctx: Context, digest: str) -> Path:
    return ctx.config.home / "serving" / digest.removeprefix("sha256:")[:16]


def _stamps_path(ctx: Context, directory: Path) -> Path:
    """Where the stamps of *directory*'s files are kept: beside a serving directory, in the
    serving folder for a `-o DIR` (nothing is written outside DIR)."""
    serving = ctx.config.home / "serving"
    if directory.parent == serving:
        return directory.with_name(f".{directory.name}.verified.json")
    import hashlib

    named = hashlib.sha256(os.fsencode(directory)).hexdigest()[:16]
    return serving / f".output-{named}.verified.json"


def _read_stamps(ctx: Context, directory: Path) -> dict[str, str]:
    try:
        data = json.loads(_stamps_path(ctx, directory).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("directory") != str(directory):
        return {}
    stamps = data.get("files")
    return {str(k): str(v) for k, v in stamps.items()} if isinstance(stamps, dict) else {}


def _write_stamps(ctx: Context, directory: Path, stamps: dict[str, str]) -> None:
    with contextlib.suppress(OSError):  # no stamps only costs the next start a re-hash
        path = _stamps_path(ctx, directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"directory": str(directory), "files": stamps})


def _complete(ctx: Context, directory: Path, selection: Selection) -> dict[str, str] | None:
    """The stamps of *directory*'s files when it holds *selection*'s pull: its serve.json
    names the digest and every file holds its bytes, proven as the fetch cache proves an
    entry (`registry.store.cache.check_file`; a file that is still the cache's own entry is
    asked of the cache). None when anything differs."""
    try:
        data = json.loads((directory / SERVE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SERVE_SCHEMA \
            or data.get("digest") != selection.found.digest:
        return None
    recorded, stamps = _read_stamps(ctx, directory), {}
    for entry in merged(selection).files:
        path = directory.joinpath(*entry.path.split("/"))
        now = file_stamp(path)
        if now is None or path.lstat().st_size != entry.size:
            return None
        if now != recorded.get(entry.path) and _is_entry(ctx, path, entry.xxh3) \
                and ctx.cache.verified(entry.xxh3, entry.size) is not None:
            recorded[entry.path] = now  # the cache proved the very inode
        stamp = check_file(path, entry.xxh3, recorded.get(entry.path))
        if stamp is None:
            return None
        stamps[entry.path] = stamp
    return stamps


def _is_entry(ctx: Context, path: Path, digest: Digest) -> bool:
    """Whether *path* is (a hard link of) the cache's entry for *digest*."""
    try:
        return path.samefile(ctx.cache.path(digest))
    except OSError:
        return False


def _placed_stamps(directory: Path, selection: Selection) -> dict[str, str]:
    """The stamps of the files a pull just placed (verified on their way from the cache)."""
    stamps = {}
    for entry in merged(selection).files:
        stamp = file_stamp(directory.joinpath(*entry.path.split("/")))
        if stamp is not None:
            stamps[entry.path] = stamp
    return stamps


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock on *dest*'s serving directory: two `serve`s of one digest on a
    node (two replicas sharing a hostPath) pull it once, and never swap it under a server."""
    from registry.errors import UsageError
    from registry.filelock import flock

    path = dest.parent / f".{dest.name}.lock"
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(flock(path))
        except OSError as exc:
            what = "it is a directory" if isinstance(exc, IsADirectoryError) else (
                exc.strerror or str(exc))
            raise UsageError(f"serve keeps its lock file at {path}, which cannot be opened: "
                             f"{what}; remove it, or point ENGINECTL_HOME elsewhere") from exc
        yield


def prepare(ctx: Context, selection: Selection, runtime: RuntimeExecutable, *, host: str,
            port: int, progress: Progress | None = None, warm: bool = True,
            output: Path | None = None) -> Pulled:
    """*selection* in its serving directory (or *output*, a directory `check_target` took
    as `pull -o` would), pulled there unless it is complete already."""
    if output is not None:
        return _prepare(ctx, selection, runtime, output, host=host, port=port,
                        progress=progress, warm=warm, own=False)
    dest = serving_dir(ctx, selection.found.digest)
    with _locked(dest):
        return _prepare(ctx, selection, runtime, dest, host=host, port=port, progress=progress,
                        warm=warm, own=True)


def _prepare(ctx: Context, selection: Selection, runtime: RuntimeExecutable, dest: Path, *,
             host: str, port: int, progress: Progress | None, warm: bool, own: bool) -> Pulled:
    stamps = _complete(ctx, dest, selection)
    if stamps is None:
        target = check_target(ctx, dest, verb="serve", force=own, own=own)
        pulled = place(ctx, selection, target, runtime=runtime, host=host, port=port,
                       progress=progress, warm=warm)
        _write_stamps(ctx, dest, _placed_stamps(dest, selection))
        return pulled
    _write_stamps(ctx, dest, stamps)
    pulled = pulled_for(selection, runtime, dest, host=host, port=port,
                        cached_bytes=merged(selection).size, warm=_kept_warm(dest, warm))
    write_json(dest / SERVE_FILE, pulled.serve_json())
    return pulled


def _kept_warm(dest: Path, warm: bool) -> Warm | None:
    """The warm cache an earlier start placed in *dest* (its serve.json names it and
    `.warm/` is there), which the runtime has been adding to since; None without one."""
    try:
        data = json.loads((dest / SERVE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    env = data.get("env") if isinstance(data, dict) else None
    if not warm or not data.get("warm_cache") or not isinstance(env, dict) \
            or not (dest / WARM_DIR).is_dir():
        return None
    return Warm(str(data["warm_cache"]), {str(k): str(v) for k, v in env.items()})


@dataclass(frozen=True)
class ServeOptions(NodeOptions):
    """The rarer choices of `serve`: `NodeOptions`, what to tell when the server starts, and
    the directory to serve from."""

    started: Callable[[Pulled], None] | None = None  # told what runs, just before it starts
    output: Path | str | None = None  # `serve -o DIR` (default: the serving directory)


def serve(
    ctx: Context,
    ref: str | None,
    *,
    model: str | None = None,
    gpu: str | GpuSpec = "auto",
    min_seq_len: int | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    executable: str | None = None,
    options: ServeOptions = ServeOptions(),
) -> int:
    """Pull *ref* (or what resolve ranks first for *model* on *gpu*) and run its server here
    until it exits; its exit code. `options.started` is told what runs, just before it starts.
    `MachineError` (exit 3), before anything is pulled, when the artifact needs more GPUs
    of its SKU (tp × pp) than nvidia-smi lists here (`pipeline.planning.capacity`).
    `options.output` (`serve -o DIR`): served from DIR, placed where and as `pull -o DIR`
    places (the same target rule, checked first; a DIR that holds this artifact's pull
    already is served as it is)."""
    request = model_request("serve", ref, model, gpu, min_seq_len=min_seq_len, options=options,
                            ctx=ctx)
    directory = None if options.output is None else check_target(
        ctx, options.output, verb="serve", force=False).path
    selection = select(ctx, ref, request=request, allow_unready=options.allow_unready)
    if (short := serving_shortfall(selection.manifest.labels)) is not None:  # before a pull
        raise short.error(f"cannot serve {selection.found.digest} here")
    runtime = find_runtime(selection.template.runtime, executable=executable)
    pulled = prepare(ctx, selection, runtime, host=host, port=port, progress=options.progress,
                     warm=options.warm, output=directory)
    ctx.close()  # the server may run for weeks: hold no database connection meanwhile
    if options.started is not None:
        options.started(pulled)
    return run_foreground(pulled.argv, cwd=pulled.directory, env=pulled.env)


# --- the process ------------------------------------------------------------------------------


def _prctl(option: int, value: int) -> None:
    """prctl(2) on Linux; nothing elsewhere (or when libc will not say)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def _reap_orphans() -> None:
    """Reap what the server orphaned and has exited (they come here: we are a subreaper);
    children outside its group that still run are not ours to wait for."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if not pid:
            return


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run_foreground(argv: Sequence[str], *, cwd: Path | None = None,
                   env: Mapping[str, str] | None = None, grace_s: float = STOP_GRACE_S) -> int:
    """Run *argv* until it exits, passing signals on to its process group; its exit code.
    The server starts through the process runner, whose guard ends its group if enginectl
    dies (even of SIGKILL, which cannot be passed on); what it leaves in its group when it
    exits is stopped by the runner's `stop_group` (SIGTERM, SIGKILL after *grace_s*)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    process = start_process(argv, log_path=None, cwd=cwd,
                            env={**os.environ, **env} if env else None)

    def forward(signum: int, _frame: FrameType | None) -> None:
        process.signal_group(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        returncode = process.wait()
    finally:
        process.stop(grace_s)
        _reap_orphans()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert returncode is not None  # noqa: S101 - waited for without a timeout
    return exit_code(returncode)
