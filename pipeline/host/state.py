"""What a build remembers between runs, in files of its work directory: the plan
(`pipeline.planning.plan_cache`) and what a Python said about its installed distributions
(`remembered_answer`: vLLM's Python, `pipeline.host.runtimes.remembered_vllm_in`, and the
builder's, `pipeline.planning.probe.probe`). Each file is written whole or not at all
(`write_atomically`), so a reader finds the old file, the new one, or none; one it cannot
read or trust is a miss.

A Python's answer is taken again while nothing it depends on changed (`python_signature`):
the interpreter's file (its stat and where it resolves), its venv's pyvenv.cfg, the
PYTHON* variables and the directory it is run from, and each directory of its path and its
user site: each one's stat, and the name and mtime of each distribution's metadata
(.dist-info, .egg-info, .egg-link) and .pth file in it, which installing, upgrading or
removing a package changes. The directory a Python runs from (the '' of its path) is
compared by what in it could answer (those metadata, and anything named vllm*), not by its
mtime, which changes all the time. An answer given in the seconds after any of those
changed (`RACY_S`) is not remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

SCHEMA: Final = 2  # what a remembered answer's file holds; another is a miss
RACY_S: Final = 2.0
"""A file or directory changed this recently may change again within its mtime's tick: what
was read of it is not remembered (here, and `pipeline.planning.file_stats`'s signatures)."""
_LISTED: Final = (".dist-info", ".egg-info", ".egg-link", ".pth")


def write_atomically(path: Path, data: bytes) -> None:
    """*data* as *path*'s whole content, by a rename over it (its directory made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        Path(name).replace(path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def remembered_answer(directory: Path, what: str, python: str | None,
                      ask: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """What *ask* answers about the Python at *python* (its resolved path; None: not found,
    and nothing is remembered), remembered in *directory* under *what* (the module doc).
    *ask*'s answer carries `sys_path` (that Python's, '' as it is) and `user_site`; None
    from it is answered, never remembered."""
    if python is None:
        return ask()
    name = hashlib.sha256(f"{what}\0{python}".encode("utf-8", "surrogateescape")).hexdigest()
    path = directory / what / f"{name[:32]}.json"
    try:
        entry = json.loads(path.read_bytes())
        answer = entry["answer"]
        if entry["schema"] == SCHEMA and entry["python"] == python and isinstance(answer, dict) \
                and entry["signature"] == _jsonable(python_signature(
                    python, answer["sys_path"], answer["user_site"])[0]):
            return answer
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # ask
    started = time.time()
    answer = ask()
    if answer is None:
        return None
    try:
        signature, newest = python_signature(python, answer["sys_path"], answer["user_site"])
        if newest < started - RACY_S:
            write_atomically(path, json.dumps({"schema": SCHEMA, "python": python,
                                               "signature": signature,
                                               "answer": answer}).encode())
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not remembered: the next build asks again
    return answer


def _jsonable(value: object) -> object:
    return json.loads(json.dumps(value))


def python_signature(python: str, sys_path: Sequence[str],
                     user_site: str | None) -> tuple[list[object], float]:
    """What `remembered_answer` compares for the Python at *python* whose path is *sys_path*
    (the module doc), and the newest change time among it."""
    st = os.stat(python)  # noqa: PTH116 - the interpreter a link leads to
    newest = max(st.st_mtime, st.st_ctime)
    cwd = str(Path.cwd())
    signature: list[object] = [
        python, os.path.realpath(python), [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns],
        cwd, sorted((k, v) for k, v in os.environ.items() if k.startswith("PYTHON")),
    ]
    config = str(Path(python).parent.parent / "pyvenv.cfg")
    for where in [config, *sys_path, *([user_site] if user_site else [])]:
        here = where in ("", cwd)  # the directory it runs from: what in it could answer
        try:
            st = os.stat(where or ".")  # noqa: PTH116
        except OSError:
            signature.append([where, None])
            continue
        listed: list[tuple[str, int]] = []
        if Path(where or ".").is_dir():
            with os.scandir(where or ".") as entries:
                for item in entries:
                    if item.name.endswith(_LISTED) or (here and item.name.startswith("vllm")):
                        mtime = item.stat(follow_symlinks=False).st_mtime_ns
                        listed.append((item.name, mtime))
                        newest = max(newest, mtime / 1e9)
        if here:
            signature.append([where, sorted(listed)])
            continue
        newest = max(newest, st.st_mtime, st.st_ctime)
        signature.append([where, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, sorted(listed)])
    return signature, newest
