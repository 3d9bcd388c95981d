"""Staging a directory: a private temp directory beside the target is filled, then renamed
into place, so the target holds either what it held or the whole new content.

    staging = stage_beside(dest, "fetch")      # .DEST.fetch-HOST-PID-XXXXXXXX
    ... fill staging ...
    swap_into_place(staging, dest)             # a non-empty DEST is set aside meanwhile

A process killed half way leaves its staging directory (or, mid-swap, the set-aside old
content `.DEST.old-HOST-PID`) beside DEST; `clear_abandoned`, called before the next
staging into the same DEST, removes the first and puts the second back. Names carry the
host and PID, so directories of live processes and of other hosts are left alone.

Imports nothing of enginectl but `registry.errors`: any verb that fills a directory may use it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from pathlib import Path

from registry.errors import UsageError


def owner() -> str:
    """Who made a staging or set-aside directory: `HOST-PID`, read back by clear_abandoned."""
    return f"{os.uname().nodename}-{os.getpid()}"  # gethostname(2), without importing socket


def pid_alive(pid: int) -> bool:
    """Whether process *pid* runs on this host (someone else's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def stage_beside(dest: Path, verb: str) -> Path:
    """A private temp directory beside *dest* (`.DEST.VERB-HOST-PID-X`), named so
    `clear_abandoned` can find it; UsageError, naming *verb*, when nothing can be written
    there."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.{verb}-{owner()}-", dir=dest.parent))
    except OSError as exc:
        raise UsageError(f"cannot write beside {dest}: {exc.strerror or exc}; {verb} into a "
                         "directory you can write") from exc


def clear_abandoned(dest: Path, verb: str) -> None:
    """Tidy what *verb*s into *dest* that were killed on this host left beside it: staging
    directories (`.DEST.VERB-HOST-PID-X`) are removed; a set-aside previous content
    (`.DEST.old-HOST-PID`, killed mid-swap) is put back when DEST is missing, else removed.
    Directories of live processes and of other hosts are left alone."""
    host = os.uname().nodename
    for path in dest.parent.glob(f".{glob.escape(dest.name)}.*-*"):
        kind, _, their = path.name[len(dest.name) + 2:].partition("-")
        if kind == verb:
            their = their.rsplit("-", 1)[0]
        elif kind != "old":
            continue
        their_host, _, pid = their.rpartition("-")
        if their_host != host or not pid.isdigit() or pid_alive(int(pid)) or not path.is_dir():
            continue
        if kind == "old" and not dest.exists():
            path.rename(dest)
        else:
            shutil.rmtree(path, ignore_errors=True)


def swap_into_place(staging: Path, dest: Path) -> None:
    """*staging* renamed to *dest*. An empty *dest* is removed first; a non-empty one is set
    aside beside it (`.DEST.old-HOST-PID`) until the rename is done, and put back when the
    rename fails or is interrupted, then removed."""
    if not dest.exists():
        staging.rename(dest)
        return
    if not any(dest.iterdir()):
        dest.rmdir()
        staging.rename(dest)
        return
    old = dest.parent / f".{dest.name}.old-{owner()}"
    dest.rename(old)
    try:
        staging.rename(dest)
    except BaseException:  # an OSError, or Ctrl-C between the two renames
        old.rename(dest)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)
