"""flock(2) on a lock file: how enginectl makes processes on one machine take turns.

    with flock(path) as held:                      # waits for it
    with flock(path, shared=True, blocking=False) as held:   # held is False if taken

The lock file is made (with its folder) when missing and never removed; the kernel drops the
lock when its process dies, so a killed holder never blocks the next. Users: the SQLite
registry's gc lock (`registry.sql.gclock`), the shared fetches of a work directory
(`registry.ops.fetch_files.fetch_once`) and `serve`'s serving directory
(`pipeline.deploy.serve`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def flock(path: Path, *, shared: bool = False, blocking: bool = True) -> Iterator[bool]:
    """Hold *path*'s lock for the block (shared or exclusive); yields whether it is held,
    always True when *blocking*."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode if blocking else mode | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
