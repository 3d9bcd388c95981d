"""What `pull -o DIR`, `serve -o DIR` and `fetch -o DIR` may write to, and what in it they may
remove: one rule, decided here before anything is placed.

    target = check_content(path, shown=dest, verb="pull", force=False, manifests=manifest_of)

`registry.ops.placement.check_dest` applies the whole rule. A target is refused (UsageError,
exit 2, nothing touched) when

- it is, or is a folder above, `/`, the working directory, your home directory ($HOME),
  enginectl's home, the store (`file://`) or the fetch cache; or lies inside enginectl's
  home, the store or the fetch cache; or lies in /proc, /sys or /dev (`check_dest_place`);
- a part of its path is longer than the file system takes (with room for the staging
  directory enginectl makes beside it);
- it exists and is not a directory;
- it holds anything that cannot be proven enginectl's.

Proven enginectl's means: the directory holds the marker (`registry.ops.marker`), and every
entry in it is one the marker names, each a top-level name of the manifests of the digests
the marker records (or the folder it names as holding one's files), read from the cache or
the store (never from the marker), and its content matches those manifests: every file at a
manifest path of that size (with `--verify strict`, of those bytes: xxh3-128 and sha256),
every folder on the way to one. Pull's own `serve.json` is proven by its schema, a directory
the runtime writes into (a warm cache, `.warm`) by the marker naming it with the digest of a
warm cache the store has. A file of the wrong size, a link, a name the marker does not name,
a marker naming `../x`: refused. Files the manifests list that are missing (a fill killed
half way) are no obstacle.

Then: an empty directory is filled; one a pull filled is replaced by a pull; with `force`,
pull or fetch replaces what either filled; a fill that was killed (its marker still says
`filling`) is finished by the same command without `force`. A `serve.json` alone vouches for
nothing. At a mount point, `lost+found` belongs to the file system: it neither makes the
directory non-empty nor is ever removed. What the next fill may remove is `Target.removable`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from registry.errors import NotFoundError, UsageError
from registry.identity.digest import digest_file
from registry.identity.manifest import FileEntry, Manifest
from registry.ops.marker import (
    LOST_FOUND,
    MARKER,
    SERVE_FILE,
    TEMPORARY,
    By,
    Marker,
    MarkerError,
    is_serve_file,
    is_temporary,
    read_marker,
)

PSEUDO_FILE_SYSTEMS: Final = (Path("/proc"), Path("/sys"), Path("/dev"))
"""Kernel views a fetch never writes into."""
INSIDE_REFUSED: Final = ("the store", "the fetch cache", "an older fetch cache",
                         "enginectl's home")
"""Places a target may not lie inside, as well as not be or be above."""
NAME_MAX: Final = 255  # what Linux file systems take when pathconf will not say
PATH_MAX: Final = 4096
STAGING: Final = ".pull-"
"""`.DEST.pull-HOST-PID-XXXXXXXX`: a fill's staging directory (`registry.ops.placement`)."""
_STAGING_MARGIN: Final = len("..pull--4194304-xxxxxxxx")  # + the host name (see _room)
WARM_KIND: Final = "warm-cache"

ManifestOf = Callable[[str], Manifest]
"""The manifest of a digest, verified, from the cache or the store."""


@dataclass(frozen=True)
class Target:
    """A directory a fill may use: *path* (absolute) and what in it is proven enginectl's."""

    path: Path
    marker: Marker | None = None
    removable: frozenset[str] = field(default_factory=frozenset)
    """Top-level names the fill may remove (proven), besides the marker."""


def staging_prefix(dest: Path) -> str:
    return f".{dest.name}{STAGING}"


STAGING_PARTS: Final = frozenset({"lock", "tree", "old"})
"""What a staging directory holds: its flock(2)ed `lock`, the `tree` filled, the `old`
content set aside."""


def is_staging(path: Path, dest: Path) -> bool:
    """Whether *path* is a staging directory of a fill into *dest*: named for it, a real
    directory, holding its `lock` file and nothing but STAGING_PARTS."""
    if not path.name.startswith(staging_prefix(dest)) or path.is_symlink() \
            or not path.is_dir():
        return False
    names = {child.name for child in path.iterdir()}
    return "lock" in names and names <= STAGING_PARTS and (path / "lock").is_file()


def present(directory: Path) -> list[str]:
    """The top-level names in *directory* a fill must account for: all but, at a mount point
    (where fills stage inside), the staging directories of fills still running and
    `lost+found`."""
    if not os.path.ismount(directory):
        return sorted(entry.name for entry in directory.iterdir())
    return sorted(entry.name for entry in directory.iterdir()
                  if entry.name != LOST_FOUND and not is_staging(entry, directory))


def check_content(absolute: Path, *, shown: Path, verb: str, force: bool,
                  manifests: ManifestOf, strict: bool = False) -> Target:
    """What may be done with the content of *absolute* (*shown* as the user wrote it), for
    *verb* (module doc): a `Target`, or UsageError."""
    if absolute.is_symlink() or (absolute.exists() and not absolute.is_dir()):
        raise UsageError(f"{shown} exists and is not a directory; {verb} into a directory")
    if not absolute.is_dir():
        return Target(absolute)
    names = present(absolute)
    marker = read_marker(absolute)
    if marker is None:
        if not names:
            return Target(absolute)
        listed = ", ".join(repr(name) for name in names[:3]) + (", …" if len(names) > 3
                                                                  else "")
        raise UsageError(
            f"{shown} is not empty and holds no earlier {verb} ({listed}; no {MARKER}): "
            f"{verb} into an empty or new directory; --force replaces only a directory pull "
            "or fetch filled")
    removable = prove(absolute, marker, names, manifests=manifests, strict=strict, shown=shown)
    if force or marker.filling is not None or (verb in ("pull", "serve") and marker.by == "pull"):
        return Target(absolute, marker, removable)
    raise UsageError(f"{shown} is not empty (an earlier {marker.by} of {marker.digest}); pass "
                     "--force to replace it")


def prove(directory: Path, marker: Marker, names: Iterable[str], *, manifests: ManifestOf,
          strict: bool, shown: Path) -> frozenset[str]:
    """The names of *directory* (*names*, the marker aside) proven enginectl's by *marker*
    (module doc); UsageError naming the first that is not."""
    files, tops = _expected(directory, marker, manifests)
    allowed = tops | set(marker.writable) | {SERVE_FILE}
    for name in sorted(marker.entries):
        if name not in allowed:
            raise MarkerError(directory, f"names {name!r}, which no artifact it records has")
    proven = set()
    for name in names:
        if name == MARKER:
            continue
        path = directory / name
        if name.startswith(TEMPORARY) and is_temporary(path):
            proven.add(name)
            continue
        if name not in marker.entries:
            raise UsageError(
                f"refusing to replace {shown}: {name!r} in it was not written by enginectl "
                f"(its {MARKER} does not name it); move it out, or use another directory")
        problem = _unproven(path, name, marker, files, strict=strict)
        if problem is not None:
            raise UsageError(f"refusing to replace {shown}: {problem}, so it is not what "
                             "enginectl placed there; move it out, or use another directory")
        proven.add(name)
    return frozenset(proven)


def _expected(directory: Path, marker: Marker, manifests: ManifestOf
              ) -> tuple[dict[str, list[FileEntry]], set[str]]:
    """The files (path → entries) of the marker's sources and their top-level names."""
    files: dict[str, list[FileEntry]] = {}
    for digest in marker.sources:
        for entry in _manifest(directory, digest, manifests).files:
            files.setdefault(entry.path, []).append(entry)
    for name, digest in marker.under:
        for entry in _manifest(directory, digest, manifests).files:
            files.setdefault(f"{name}/{entry.path}", []).append(entry)
    for name, digest in marker.writable.items():
        if _manifest(directory, digest, manifests).kind != WARM_KIND:
            raise MarkerError(directory, f"names {name!r} as a warm cache, which {digest} "
                                         "is not")
    return files, {path.split("/", 1)[0] for path in files}


def _manifest(directory: Path, digest: str, manifests: ManifestOf) -> Manifest:
    try:
        return manifests(digest)
    except NotFoundError as exc:
        raise MarkerError(directory, f"records {digest}, which the store does not have") \
            from exc


def _unproven(path: Path, name: str, marker: Marker, files: dict[str, list[FileEntry]], *,
              strict: bool) -> str | None:
    """Why *path* (the entry *name*) is not what the marker's sources placed; None if it is."""
    if name == SERVE_FILE and not any(p.split("/", 1)[0] == name for p in files):
        return None if is_serve_file(path) else f"{name!r} is not a serve.json pull wrote"
    if name in marker.writable:
        return None if path.is_dir() and not path.is_symlink() else \
            f"{name!r} is not a directory"
    folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    todo = [(path, name)]
    while todo:
        here, relative = todo.pop()
        if here.is_symlink():
            return f"{relative!r} in it is a link"
        if here.is_dir():
            if relative not in folders:
                return f"{relative!r} in it is a folder no artifact it records has"
            todo.extend((child, f"{relative}/{child.name}") for child in here.iterdir())
            continue
        problem = _file_problem(here, relative, files.get(relative, []), strict=strict)
        if problem is not None:
            return problem
    return None


def _file_problem(path: Path, relative: str, entries: list[FileEntry], *,
                  strict: bool) -> str | None:
    if not entries:
        return f"{relative!r} in it is a file no artifact it records has"
    info = path.lstat()
    import stat

    if not stat.S_ISREG(info.st_mode):
        return f"{relative!r} in it is not a regular file"
    sized = [entry for entry in entries if entry.size == info.st_size]
    if not sized:
        return f"{relative!r} in it has {info.st_size} bytes, not {entries[0].size}"
    if strict:
        found = digest_file(path, mapped=True)
        if not any(found.xxh3 == e.xxh3 and found.sha256 in (None, e.sha256) for e in sized):
            return f"{relative!r} in it holds other bytes than the artifact's"
    return None


# --- where a target may be ----------------------------------------------------------------------


def check_dest_place(dest: Path, places: Iterable[tuple[str, Path]], verb: str = "fetch",
                     inside: Iterable[str] = INSIDE_REFUSED) -> Path:
    """*dest* made absolute with `..` folded away; UsageError when it is, or is above, one of
    *places*, lies inside one of those named in *inside*, or lies in /proc, /sys or /dev.
    *verb* names the command in the message (fetch, pull)."""
    inside = frozenset(inside)
    absolute = _lexical(dest)
    seen = {absolute, _resolved(absolute)}
    for what, place in places:
        for known in {_lexical(place), _resolved(place)}:
            for candidate in seen:
                if candidate == known or candidate in known.parents:
                    raise UsageError(
                        f"refusing to {verb} into {dest}: it is {what} ({known}) or a folder "
                        f"above it; {verb} into a directory of its own, e.g. -o ./model")
                if what in inside and known in candidate.parents:
                    raise UsageError(f"refusing to {verb} into {dest}: it is inside {what} "
                                     f"({known}); {verb} into a directory of its own")
    for candidate in seen:
        for pseudo in PSEUDO_FILE_SYSTEMS:
            if candidate == pseudo or pseudo in candidate.parents:
                raise UsageError(f"refusing to {verb} into {dest}: {pseudo} is a view of the "
                                 f"kernel, not storage; {verb} into a directory on a disk")
    return absolute


def base_places(cache_root: Path, legacy: Iterable[Path], store_root: Path | None,
                extra: Iterable[tuple[str, Path]] = ()) -> list[tuple[str, Path]]:
    """What a target may never be, nor be a folder above: `/`, the working directory, the
    user's home, the store (`file://`) and the cache (and its older places), plus *extra*."""
    places = [("the root directory", Path("/")), ("the fetch cache", cache_root),
              *(("an older fetch cache", root) for root in legacy), *extra]
    for what, where in (("the working directory", Path.cwd), ("your home directory",
                                                             Path.home)):
        with contextlib.suppress(OSError, RuntimeError):  # a removed cwd, no HOME
            places.append((what, where()))
    if store_root is not None:
        places.append(("the store", store_root))
    return places


def _lexical(path: Path) -> Path:
    """*path* absolute, with `.` and `..` parts folded away as written (no links followed)."""
    return Path(os.path.normpath(path.absolute()))


def _resolved(path: Path) -> Path:
    """*path* with its links followed; as written when they loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return _lexical(path)


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


def room() -> int:
    """The bytes the staging directory's name adds to a target's last name."""
    return _STAGING_MARGIN + len(os.uname().nodename.encode())


__all__ = ["By", "Target", "check_content", "check_dest_place"]
