"""The directory a pull or a fetch fills: staged, then put into place all or nothing.

    with staged(dest, digest=digest) as tree:   # an absent path inside a staging directory
        ... fill tree, serve.json last ...
    # here dest holds tree's content and the marker; on an exception dest is as it was

What may be replaced is decided before, once, by `pipeline.deploy.guard.check_dest`
(`pull` and `fetch -o` call it; `serve` fills only its own serving directory). Every
directory filled here holds the marker (`guard.MARKER`) naming its top-level entries and
who filled it (*by*), unless the artifact brings a file of that name (*mark* False).
Staging directories are named `.DEST.pull-…` whichever verb made them: one name, one
clean-up.

The staging directory (`.DEST.pull-HOST-PID-XXXX`) is beside DEST and renamed over it, the
previous content set aside inside the staging directory until the new one is in place. A
DEST that is a mount point (a Kubernetes volume) cannot be renamed, nor reached by a rename
from another file system: then the staging directory is inside it and its entries are moved
in one by one. The marker is written first, naming what was there and what is coming, so a
fill killed half way leaves a directory the next pull knows as its own and replaces;
`serve.json` is removed first and written last, so a DEST with a `serve.json` is complete.

A staging directory holds a lock file, flock(2)ed by its pull while it runs: the next pull
into the same DEST removes staging directories whose lock is free (their pull is gone, on
this host or, for a volume that moved, another), putting back set-aside content when the
kill came mid-swap. The lock, not the PID, decides: an init container restarted after a kill
runs its pull as the same PID in a fresh PID namespace.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from pipeline.deploy.guard import (
    LOST_FOUND,
    MARKER,
    SERVE_FILE,
    SERVE_SCHEMA,
    By,
    foreign,
    read_marker,
    write_marker,
)
from registry.errors import UsageError
from registry.staging import pid_alive

SCHEMA: Final = SERVE_SCHEMA
LOCK: Final = "lock"
__all__ = ["SCHEMA", "SERVE_FILE", "is_pull", "staged", "write_json"]


def is_pull(directory: Path) -> bool:
    """Whether *directory* holds what a pull placed (its `serve.json` says so)."""
    try:
        data = json.loads((directory / SERVE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def write_json(path: Path, data: dict[str, Any]) -> None:
    """*data* at *path*, replaced atomically."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(path)


@contextlib.contextmanager
def staged(dest: Path, *, digest: str | None = None, by: By = "pull",
           mark: bool = True) -> Iterator[Path]:
    """An absent path to fill; put at *dest* (with the marker, naming *digest* and *by*;
    without *mark*, the tree's own file of that name) when the block ends without an
    exception. *dest* must be absent or a directory."""
    dest = dest.absolute()
    inside = dest.is_dir() and os.path.ismount(dest)
    parent = dest if inside else dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _clear_abandoned(dest, parent)
        _check(dest)
        staging = Path(tempfile.mkdtemp(prefix=f"{_prefix(dest)}{_owner()}-", dir=parent))
    except OSError as exc:
        too_long = " (a name too long for this file system)" \
            if exc.errno == errno.ENAMETOOLONG else ""
        raise UsageError(f"cannot write beside {dest}: {exc.strerror or exc}{too_long}; {by} "
                         "into a directory you can write, with a shorter name") from exc
    try:
        with _holding(staging / LOCK):
            tree = staging / "tree"
            yield tree
            if inside:
                _move_in(tree, dest, digest, by=by, mark=mark)
            else:
                if mark:
                    write_marker(tree, by=by, digest=digest,
                                 entries=[p.name for p in tree.iterdir()])
                _swap(tree, dest, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prefix(dest: Path) -> str:
    return f".{dest.name}.pull-"


def _owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@contextlib.contextmanager
def _holding(lock: Path) -> Iterator[None]:
    """flock(2) *lock* (made here) for the block: this staging directory is in use."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: the name decides
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _if_abandoned(staging: Path, prefix: str) -> Iterator[bool]:
    """Whether the pull that made *staging* is gone, holding its lock meanwhile when so.
    A staging directory without a lock file (made by an older enginectl, or caught between
    its mkdtemp and its lock), or on a file system without locks, is judged by its owner's
    name: this host, and a PID that is not running or is this very process (a restarted
    container)."""
    try:
        fd = os.open(staging / LOCK, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield _gone_by_name(staging.name[len(prefix):])
        return
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: its pull is running
            gone = False
        except OSError:  # a file system without locks
            gone = _gone_by_name(staging.name[len(prefix):])
        else:
            gone = True
        yield gone
    finally:
        os.close(fd)


def _gone_by_name(owner: str) -> bool:
    their_host, _, pid = owner.rsplit("-", 1)[0].rpartition("-")  # HOST-PID-<mkdtemp's>
    if their_host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) == os.getpid() or not pid_alive(int(pid))


def _check(dest: Path) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} exists and is not a directory")


def _clear_abandoned(dest: Path, parent: Path) -> None:
    prefix = _prefix(dest)
    for path in parent.glob(f"{glob.escape(prefix)}*"):
        if path.is_symlink() or not path.is_dir():
            continue
        with _if_abandoned(path, prefix) as gone:
            if not gone:
                continue
            if (path / "old").is_dir() and not dest.exists():
                (path / "old").rename(dest)
            shutil.rmtree(path, ignore_errors=True)


def _move_in(tree: Path, dest: Path, digest: str | None, *, by: By, mark: bool) -> None:
    """Replace what enginectl put in the mount point *dest* with *tree*'s entries: the
    marker first (naming both, with `filling`), `serve.json` out first and in last, the
    marker last without `filling` (or, without *mark*, the tree's own file of its name)."""
    new = sorted(p.name for p in tree.iterdir())
    marker = read_marker(dest)
    if marker is not None and marker.entries is not None:
        old = set(marker.entries)
    else:  # empty, a pull from before markers, or serve's own directory
        old = set(foreign(dest, None, transient=_prefix(dest)))
    write_marker(dest, by=by, digest=digest, entries=old | set(new), filling=_owner())
    with contextlib.suppress(FileNotFoundError):
        (dest / SERVE_FILE).unlink()
    for name in sorted(old - {LOST_FOUND, MARKER}):  # the marker is replaced, not removed
        path = dest / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    for name in sorted(new, key=lambda name: (name == MARKER, name == SERVE_FILE)):
        (tree / name).rename(dest / name)
    if mark:
        write_marker(dest, by=by, digest=digest, entries=new)


def _swap(tree: Path, dest: Path, staging: Path) -> None:
    if dest.exists():
        if not any(dest.iterdir()):
            dest.rmdir()
        else:
            dest.rename(staging / "old")
    try:
        tree.rename(dest)
    except OSError:
        if (staging / "old").exists() and not dest.exists():
            (staging / "old").rename(dest)
        raise
