"""File signatures: what says a file or a directory tree is unchanged without reading it.

A signature is the (size, mtime, ctime, inode) of every entry, with the newest change time
among them: a tree touched in the last `RACY_S` seconds may change again within its mtime's
tick, so what was computed from it is not remembered (as git does with racy entries). Pure
apart from `lstat` and `os.walk`; imports nothing of the recipe's model, so a no-op build
checks its plan cache (`pipeline.planning.plan_cache`) without it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.host.state import RACY_S  # the one window, for a Python's memo too

__all__ = ["RACY_S", "file_signature", "tree_signature"]


def _stat_of(path: Path) -> tuple[tuple[int, int, int, int], float]:
    st = path.lstat()
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino), max(st.st_mtime, st.st_ctime)


def tree_signature(root: Path) -> tuple[object, float]:
    """Every entry under *root* with its stat, and the newest change time among them."""
    entries = []
    newest = 0.0
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        for name in sorted(dirnames + filenames):
            entry = Path(dirpath, name)
            stat, changed = _stat_of(entry)
            entries.append((entry.relative_to(root).as_posix(), stat))
            newest = max(newest, changed)
    return tuple(sorted(entries)), newest


def _raise(exc: OSError) -> None:
    raise exc


def file_signature(path: Path) -> tuple[object, float]:
    """*path*'s stat, and its change time."""
    return _stat_of(path)
