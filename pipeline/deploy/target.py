"""The directory a pull fills: staged, then put into place all or nothing.

    with staged(dest, force=force) as tree:   # an absent path inside a staging directory
        ... fill tree, serve.json last ...
    # here dest holds tree's content; on an exception dest is as it was

The staging directory (`.DEST.pull-HOST-PID-XXXX`) is beside DEST and renamed over it, the
previous content set aside inside the staging directory until the new one is in place. A
DEST that is a mount point (a Kubernetes volume) cannot be renamed, nor reached by a rename
from another file system: then the staging directory is inside it, and its entries are moved
in one by one, `serve.json` removed first and written last, so a DEST with a `serve.json` is
complete. Staging directories of pulls killed on this host are removed by the next pull into
the same DEST (and the set-aside content put back when the kill came mid-swap).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from registry.errors import UsageError

SERVE_FILE: Final = "serve.json"
SCHEMA: Final = "enginectl.serve/v1"


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
def staged(dest: Path, *, force: bool = False) -> Iterator[Path]:
    """An absent path to fill; put at *dest* when the block ends without an exception.
    *dest* must be absent, empty or an earlier pull, unless *force*."""
    dest = dest.absolute()
    inside = dest.is_dir() and os.path.ismount(dest)
    parent = dest if inside else dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    _clear_abandoned(dest, parent)
    _check(dest, force)
    staging = Path(tempfile.mkdtemp(prefix=f"{_prefix(dest)}{_owner()}-", dir=parent))
    try:
        tree = staging / "tree"
        yield tree
        if inside:
            _move_in(tree, dest, staging)
        else:
            _swap(tree, dest, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prefix(dest: Path) -> str:
    return f".{dest.name}.pull-"


def _owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _check(dest: Path, force: bool) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} exists and is not a directory")
    if dest.is_dir() and not force and not is_pull(dest) \
            and any(not p.name.startswith(_prefix(dest)) for p in dest.iterdir()):
        raise UsageError(f"{dest} is not empty and holds no earlier pull; pull into an empty "
                         "directory or pass --force")


def _clear_abandoned(dest: Path, parent: Path) -> None:
    host, prefix = socket.gethostname(), _prefix(dest)
    for path in parent.glob(f"{glob.escape(prefix)}*"):
        owner = path.name[len(prefix):].rsplit("-", 1)[0]  # HOST-PID-<mkdtemp's suffix>
        their_host, _, pid = owner.rpartition("-")
        if their_host != host or not pid.isdigit() or _alive(int(pid)) or not path.is_dir():
            continue
        if (path / "old").is_dir() and not dest.exists():
            (path / "old").rename(dest)
        shutil.rmtree(path, ignore_errors=True)


def _move_in(tree: Path, dest: Path, staging: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (dest / SERVE_FILE).unlink()
    for old in dest.iterdir():
        if old != staging and not old.name.startswith(_prefix(dest)):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
    for new in sorted(tree.iterdir(), key=lambda p: p.name == SERVE_FILE):
        new.rename(dest / new.name)


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
