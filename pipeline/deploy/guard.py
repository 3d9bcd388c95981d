"""What `pull -o DIR` and `fetch -o DIR` may write to, and what they may replace: one rule.

    check_dest(dest, force=..., verb="pull", places=protected_places(ctx))

A target is refused (UsageError, exit 2, nothing touched) when (the first and the last
places are `registry.ops.fetch_files.check_dest_place`'s, which the library's fetch applies too)

- it is, or is a folder above, `/`, the working directory, your home directory ($HOME),
  enginectl's home, the store (`file://`) or the fetch cache; or lies inside enginectl's
  home, the store or the fetch cache; or lies in /proc, /sys or /dev;
- a part of its path is longer than the file system takes (with room for the staging
  directory enginectl makes beside it);
- it exists and is not a directory;
- it holds anything enginectl did not write there.

What enginectl wrote is what the marker says: pull and fetch leave `.enginectl-target.json`
in every directory they fill, naming its top-level entries. A directory may be replaced when
it is empty, or when it holds the marker and nothing the marker does not name: a pull
replaces an earlier pull (or one made before markers, recognised by its `serve.json`); with
`force` pull or fetch replaces what either of them filled. `--force` never replaces a
directory of someone else's files: a directory the marker does not vouch for is refused with
or without it. At a mount point, `lost+found` belongs to the file system: it neither makes
the directory non-empty nor is ever removed.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from registry.errors import UsageError
from registry.identity.manifest import FILL_MARKER
from registry.ops import fetch, fetch_files

if TYPE_CHECKING:
    from registry.context import Context

MARKER: Final = FILL_MARKER  # never part of an artifact: import skips it
MARKER_SCHEMA: Final = "enginectl.target/v1"
SERVE_FILE: Final = "serve.json"
SERVE_SCHEMA: Final = "enginectl.serve/v1"
LOST_FOUND: Final = "lost+found"
NAME_MAX: Final = 255  # what Linux file systems take when pathconf will not say
PATH_MAX: Final = 4096
TEMPORARY: Final = (f".{MARKER}.tmp-", f".{SERVE_FILE}.tmp-")
"""Names of the marker and serve.json being written (atomically, through these)."""
INSIDE_REFUSED: Final = (*fetch_files.INSIDE_REFUSED, "an older fetch cache", "enginectl's home")
"""What a target may not lie inside: the library's places, older caches and enginectl's home."""
_STAGING_MARGIN: Final = len("..fetch--4194304-xxxxxxxx")  # + the host name (see _room)

By = Literal["pull", "fetch"]


@dataclass(frozen=True)
class Marker:
    """Who filled a directory and what they put there (None: unknown, a pre-marker pull)."""

    by: By
    digest: str | None
    entries: frozenset[str] | None
    filling: str | None = None  # HOST-PID of a fill in progress at a mount point


def read_marker(directory: Path) -> Marker | None:
    """The marker of *directory*; for a pull made before markers, its `serve.json`."""
    data = _json(directory / MARKER)
    if isinstance(data, dict) and data.get("schema") == MARKER_SCHEMA \
            and data.get("by") in ("pull", "fetch") and isinstance(data.get("entries"), list):
        return Marker(by=data["by"], digest=data.get("digest"),
                      entries=frozenset(str(name) for name in data["entries"]),
                      filling=data.get("filling"))
    serve = _json(directory / SERVE_FILE)
    if isinstance(serve, dict) and serve.get("schema") == SERVE_SCHEMA:
        return Marker(by="pull", digest=serve.get("digest"), entries=None)
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_marker(directory: Path, *, by: By, digest: str | None, entries: Iterable[str],
                 filling: str | None = None) -> None:
    """Say that *by* put *entries* (top-level names) in *directory*; replaced atomically."""
    data: dict[str, Any] = {"schema": MARKER_SCHEMA, "by": by, "digest": digest,
                            "entries": sorted(set(entries) - {MARKER})}
    if filling is not None:
        data["filling"] = filling
    temp = directory / f".{MARKER}.tmp-{os.getpid()}"
    temp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(directory / MARKER)


def foreign(directory: Path, marker: Marker | None, *, transient: str = "") -> list[str]:
    """The top-level names in *directory* that enginectl did not write there: all of them
    without a marker, those the marker does not name with one (none for a pre-marker pull).
    Names starting with *transient* (a pull's own staging at a mount point) or one of
    TEMPORARY, and a mount point's `lost+found`, are in flight or the file system's: never
    counted."""
    mount = os.path.ismount(directory)
    skipped = (*((transient,) if transient else ()), *TEMPORARY)
    names = sorted(entry.name for entry in directory.iterdir()
                   if not entry.name.startswith(skipped)
                   and not (mount and entry.name == LOST_FOUND))
    if marker is None:
        return names
    if marker.entries is None:
        return []
    return [name for name in names if name != MARKER and name not in marker.entries]


def protected_places(ctx: Context) -> list[tuple[str, Path]]:
    """What a target may never be nor be above (`registry.ops.fetch_files.protected_places`), and
    enginectl's home."""
    return fetch_files.protected_places(fetch.lazy_store(ctx), ctx.cache,
                                  [("enginectl's home", ctx.config.home)])


def check_name_lengths(path: Path, what: str, *, room: int = 0) -> None:
    """UsageError when a part of *path* is longer than the file system takes (the last part
    with *room* bytes to spare, for what enginectl names after it), or the whole is."""
    parts = os.fsencode(path).split(b"/")
    limit = _name_max(path)
    for index, part in enumerate(parts):
        spare = room if index == len(parts) - 1 else 0
        if len(part) + spare > limit:
            shown = os.fsdecode(part)
            shown = shown if len(shown) <= 40 else f"{shown[:40]}…"
            extra = (f", {limit - spare} here: enginectl stages beside it under a name "
                     f"{spare} bytes longer") if spare else ""
            raise UsageError(f"{what} {shown!r}: a name of {len(part)} bytes; this file system "
                             f"takes at most {limit} per name{extra}; use a shorter name")
    if len(os.fsencode(path.absolute())) >= PATH_MAX:
        raise UsageError(f"{what}: the path is {len(os.fsencode(path.absolute()))} bytes; "
                         f"file systems take at most {PATH_MAX - 1}; use a shorter path")


def _name_max(path: Path) -> int:
    for candidate in (path.absolute(), *path.absolute().parents):
        try:
            if candidate.is_dir():
                return int(os.pathconf(candidate, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX


def _room() -> int:
    return _STAGING_MARGIN + len(os.uname().nodename.encode())


def check_dest(dest: Path | str, *, force: bool, verb: By,
               places: Sequence[tuple[str, Path]]) -> Path:
    """*dest* (absolute) when *verb* may fill it, replacing what is there (module doc);
    UsageError, with nothing touched, when not."""
    dest = Path(dest)
    check_name_lengths(dest, "-o", room=_room())
    absolute = fetch_files.check_dest_place(dest, places, verb, INSIDE_REFUSED)
    try:
        return _check_content(absolute, dest, force=force, verb=verb)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"-o {dest}: a name is too long for this file system; use a "
                             "shorter one") from exc
        raise UsageError(f"cannot {verb} into {dest}: {exc.strerror or exc}") from exc


def _check_content(absolute: Path, dest: Path, *, force: bool, verb: By) -> Path:
    if absolute.is_symlink() or (absolute.exists() and not absolute.is_dir()):
        raise UsageError(f"{dest} exists and is not a directory; {verb} into a directory")
    if not absolute.is_dir():
        return absolute
    marker = read_marker(absolute)
    others = foreign(absolute, marker, transient=f".{absolute.name}.pull-")
    if marker is None:
        if not others:
            return absolute
        listed = ", ".join(repr(name) for name in others[:3]) + (", …" if len(others) > 3
                                                                   else "")
        earlier = "holds no earlier pull" if verb == "pull" else "holds no earlier fetch"
        raise UsageError(
            f"{dest} is not empty and {earlier} ({listed}; no {MARKER}): {verb} into an "
            f"empty or new directory; --force replaces only a directory pull or fetch filled")
    if others:
        raise UsageError(
            f"refusing to replace {dest}: {others[0]!r} in it was not written by enginectl "
            f"(its {MARKER} does not name it); move it out, or {verb} into another directory")
    if force or (verb == "pull" and marker.by == "pull"):
        return absolute
    raise UsageError(f"{dest} is not empty (an earlier {marker.by} of {marker.digest}); pass "
                     "--force to replace it")
