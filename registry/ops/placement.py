"""Placing a directory: filled aside, then put at its target all or nothing. The one way
`pull`, `serve`, `fetch` (and the library's `fetch_manifest`) place a directory.

    target = check_dest(...)                    # registry.ops.target: what may be removed
    with placing(target, by="pull", digest=d) as placed:
        ... fill placed.tree (an absent path) ...
        placed.record(sources=[d, ...], writable={".warm": w})
    # here target.path holds the tree and the marker; on an exception it is as it was

The staging directory `.DEST.pull-HOST-PID-XXXXXXXX` is made beside DEST and holds a `lock`
file, flock(2)ed while its fill runs, and `tree`. At the end `tree` is renamed over DEST, the
previous content set aside as `old` in the staging directory until the rename is done. A DEST
that is a mount point (a Kubernetes volume) cannot be renamed, nor reached by a rename from
another file system: then the staging directory is inside DEST and its entries are moved in
one by one: the marker first, recording what was there and what comes (`filling`), then
`serve.json` and what `Target.removable` names are removed, the new entries moved in
(`serve.json` last), and the marker written again without `filling`. Only what the target
rule proved is removed; nothing outside DEST but this fill's own staging directory.

A fill killed at any step is finished or undone by the same command run again: its staging
directory is found by its prefix and its lock file, and removed when the lock is free (the
fill is gone, on this host or, for a volume that moved, another; an init container restarted
after a kill runs as the same PID, so the lock decides, not the PID), putting back `old` when
the kill came between the two renames. A mount point keeps the `filling` marker, which names
the sources of both the old and the new content, so every entry left there is proven against
them and replaced. A directory beside DEST with the prefix is removed only when it holds the
lock file and nothing but `lock`, `tree` and `old`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from registry.errors import DiskFullError, UsageError
from registry.ops.marker import LOST_FOUND, MARKER, SERVE_FILE, TEMPORARY, By, write_marker
from registry.ops.target import (
    INSIDE_REFUSED,
    ManifestOf,
    Target,
    check_content,
    check_dest_place,
    check_name_lengths,
    is_staging,
    present,
    room,
    staging_prefix,
)

LOCK: Final = "lock"


def check_dest(dest: Path | str, *, verb: str, force: bool,
               places: Sequence[tuple[str, Path]], manifests: ManifestOf,
               strict: bool = False) -> Target:
    """The `Target` *dest* is when *verb* may fill it (`registry.ops.target`): the place
    first, then what killed fills left is tidied (`clear_abandoned`), then the content;
    UsageError, with nothing of the user's touched, when not."""
    dest = Path(dest)
    check_name_lengths(dest, "-o", room=room())
    absolute = check_dest_place(dest, places, verb, INSIDE_REFUSED)
    try:
        clear_abandoned(absolute)
        return check_content(absolute, shown=dest, verb=verb, force=force,
                             manifests=manifests, strict=strict)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"-o {dest}: a name is too long for this file system; use a "
                             "shorter one") from exc
        raise UsageError(f"cannot {verb} into {dest}: {exc.strerror or exc}") from exc


@dataclass
class Placed:
    """A fill in progress: *tree* to fill, and what the marker will record."""

    tree: Path
    sources: tuple[str, ...] = ()
    under: tuple[tuple[str, str], ...] = ()
    writable: dict[str, str] = field(default_factory=dict)

    def record(self, *, sources: Iterable[str], under: Iterable[tuple[str, str]] = (),
               writable: Mapping[str, str] | None = None) -> None:
        """The digests whose files are at the tree's top, those whose files are in a folder
        of it (folder → digest), and directories a runtime writes into (name → warm cache
        digest)."""
        self.sources = tuple(dict.fromkeys(sources))
        self.under = tuple(under)
        self.writable = dict(writable or {})


def owner() -> str:
    """Who fills: `HOST-PID` (the marker's `filling`, the staging directory's name)."""
    return f"{os.uname().nodename}-{os.getpid()}"


@contextlib.contextmanager
def placing(target: Target, *, by: By, digest: str | None, mark: bool = True
            ) -> Iterator[Placed]:
    """A `Placed` whose tree is put at *target* when the block ends without an exception
    (module doc); with *mark*, the marker naming *digest*, *by* and what was recorded;
    without, the tree's own file of that name stays (an artifact that has one)."""
    dest = target.path
    inside = dest.is_dir() and os.path.ismount(dest)
    parent = dest if inside else dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{staging_prefix(dest)}{owner()}-",
                                        dir=parent))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(parent, "the target directory") from exc
        raise UsageError(f"cannot write beside {dest}: {exc.strerror or exc}; {by} into a "
                         "directory you can write") from exc
    try:
        with _holding(staging / LOCK):
            placed = Placed(staging / "tree")
            yield placed
            try:
                _put(placed, target, staging, inside=inside, by=by, digest=digest, mark=mark)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFullError(dest, "the target directory") from exc
                raise
    finally:
        _remove_staging(staging)


def _remove_staging(staging: Path) -> None:
    """*staging* removed, its lock file last: a kill on the way leaves it locked-and-free
    (cleared by the next fill) or empty (removed by it)."""
    for part in ("tree", "old"):
        shutil.rmtree(staging / part, ignore_errors=True)
    with contextlib.suppress(OSError):
        (staging / LOCK).unlink()
    with contextlib.suppress(OSError):
        staging.rmdir()


def _put(placed: Placed, target: Target, staging: Path, *, inside: bool, by: By,
         digest: str | None, mark: bool) -> None:
    placed.tree.mkdir(exist_ok=True)
    placed.tree.chmod(0o755)  # an ordinary directory, whatever the umask made
    _check_unchanged(target)
    if inside:
        _move_in(placed, target, by=by, digest=digest, mark=mark)
        return
    if mark:
        write_marker(placed.tree, by=by, digest=digest,
                     entries=[p.name for p in placed.tree.iterdir()],
                     sources=placed.sources, under=placed.under, writable=placed.writable)
    _swap(placed.tree, target, staging)


def clear_abandoned(dest: Path) -> None:
    """Remove the staging directories of fills into *dest* that were killed (module doc),
    putting back content a kill left set aside. Call before `check_dest` looks at *dest*."""
    dest = dest.absolute()
    prefix = staging_prefix(dest)
    for parent in {dest.parent, dest} if dest.is_dir() and not dest.is_symlink() \
            else {dest.parent}:
        with contextlib.suppress(OSError):
            for path in parent.glob(f"{glob.escape(prefix)}*"):
                _clear(path, dest)


def _clear(path: Path, dest: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        return
    if not any(path.iterdir()):
        path.rmdir()  # a staging directory killed as it was removed: nothing in it
        return
    if not is_staging(path, dest):
        return  # not a staging directory enginectl made: left alone
    with _if_abandoned(path / LOCK) as gone:
        if not gone:
            return
        old = path / "old"
        if old.is_dir() and not old.is_symlink() and path.parent == dest.parent \
                and not dest.exists():
            old.rename(dest)
        _remove_staging(path)


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
def _if_abandoned(lock: Path) -> Iterator[bool]:
    """Whether the fill that holds *lock* is gone, holding its lock meanwhile when so. On a
    file system without locks, judged by the owner in the staging directory's name: this
    host, and a PID that is not running or is this very process (a restarted container)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: its fill is running
            gone = False
        except OSError:  # a file system without locks
            gone = _gone_by_name(lock.parent.name)
        else:
            gone = True
        yield gone
    finally:
        os.close(fd)


def _gone_by_name(name: str) -> bool:
    owner_part = name.split(".pull-", 1)[-1]
    their_host, _, pid = owner_part.rsplit("-", 1)[0].rpartition("-")  # HOST-PID-<mkdtemp's>
    if their_host != os.uname().nodename or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _check_unchanged(target: Target) -> None:
    """UsageError when something appeared in the target since it was checked: only what the
    target rule proved is ever removed or renamed over."""
    dest = target.path
    if not dest.is_dir():
        return
    proven = target.removable | {MARKER}
    added = [name for name in present(dest) if name not in proven]
    if added:
        raise UsageError(f"refusing to replace {dest}: {added[0]!r} appeared in it while it "
                         "was filled; move it out, and run the same command again")


def _move_in(placed: Placed, target: Target, *, by: By, digest: str | None,
             mark: bool) -> None:
    """Replace what the target rule proved in the mount point with the tree's entries
    (module doc)."""
    dest, tree, before = target.path, placed.tree, target.marker
    new = sorted(p.name for p in tree.iterdir())
    old_sources = before.sources if before is not None else ()
    old_under = before.under if before is not None else ()
    old_writable = dict(before.writable) if before is not None else {}
    kept = {name for name in target.removable if not name.startswith(TEMPORARY)}
    write_marker(dest, by=by, digest=digest, entries=kept | set(new),
                 sources=(*old_sources, *placed.sources),
                 under=(*old_under, *placed.under),
                 writable={**old_writable, **placed.writable}, filling=owner())
    removable = sorted(sorted(target.removable - {MARKER, LOST_FOUND}),
                       key=lambda name: name != SERVE_FILE)  # serve.json out first
    for name in removable:
        path = dest / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    for name in sorted(new, key=lambda name: (name == MARKER, name == SERVE_FILE)):
        (tree / name).rename(dest / name)
    if mark:
        write_marker(dest, by=by, digest=digest, entries=new, sources=placed.sources,
                     under=placed.under, writable=placed.writable)


def _swap(tree: Path, target: Target, staging: Path) -> None:
    dest = target.path
    if dest.exists():
        if not any(dest.iterdir()):
            dest.rmdir()
        else:
            dest.rename(staging / "old")
    try:
        tree.rename(dest)
    except BaseException:  # an OSError, or Ctrl-C between the two renames
        if (staging / "old").exists() and not dest.exists():
            (staging / "old").rename(dest)
        raise
