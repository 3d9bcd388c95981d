"""The local blob cache: fetched file bytes keyed by their xxh3-128 digest.

    <root>/xxh3-128/<2 hex>/<30 hex>            an entry: one blob's bytes, read-only
    <root>/xxh3-128/<2 hex>/.<30 hex>.verified  its stamp: size, mtime, ctime, inode and
                                                device when its bytes were last proven
    <root>/xxh3-128/<2 hex>/.tmp-<hex>          a fill in progress, locked (or killed:
                                                unlocked, and gc removes it)
    <root>/manifests/sha256/<64 hex>.json       a copy of a manifest fetched from the store

Only `xxh3-128/` and `manifests/` belong to the cache: anything else under the root (the
vLLM environment that scripts/install-vllm puts in ~/.cache/enginectl) is never read,
listed or removed.

A manifest is named by the sha256 of its own bytes and never changes, so a copy whose bytes
still hash to its name is as good as the store's: a refetch by full digest reads it and
needs no store request (for S3, not even boto3). The hash is checked on every read; a copy
that fails it is removed and the store is asked again.

A second fetch of the same content costs a stat and a hard link per file; an interrupted
fetch resumes with the blobs it had finished. Entries are written to a temp name, verified,
renamed into place and made read-only, so a crash never leaves a partial entry under a
digest's name.

Fetches hard-link entries into their targets, so an entry is shared with every fetched copy
of it, and someone who edits a fetched file in place (after `chmod u+w`, or as root) edits
the entry too. Every such edit changes the inode's ctime, which no one can set back; an
entry is trusted only while its size, mtime, ctime, inode and device are the ones stamped
when it was last verified. Otherwise it is re-hashed: stamped again when it still holds its
digest's bytes (a link or chmod changes the ctime too), evicted when it does not.
`file_stamp` and `check_file` apply the same rule to a file outside the cache (`serve`'s
directory, whose files were placed from here).

Every temp file (`.tmp-<hex>`: a fill, a stamp, a manifest copy being written) is held
under an exclusive `fcntl.flock` by its writer from the moment it bears that name until it
is renamed into place or removed; the kernel drops the lock when the writer dies. A writer
creates it as `.new-<hex>`, locks it and only then renames it to `.tmp-<hex>`, so no
`.tmp-` file is ever seen unlocked while its writer lives. gc (`remove_partial`) removes
only temp files that are unlocked and older than its cutoff, so even `gc --grace 0` never
takes the temp file of a fetch in progress, however long it has been stalled, and always
takes a killed one's; a `.new-` file (a writer killed in the instant between creating and
locking it) only once it is also older than `NEW_GRACE`. A writer writes *into* its temp
path (never replaces it), so the lock stays on the file it names.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from registry.errors import DiskFullError, RegistryError
from registry.identity.digest import Digest, digest_file, sha256_of

FOLDER: Final = "xxh3-128"
MANIFESTS: Final = "manifests/sha256"
# a `.new-` temp file is a writer's for the instant between creating and locking it (module
# doc): one this old is a killed writer's, whatever gc's grace
NEW_GRACE: Final = timedelta(minutes=10)


def _stamp_of(info: os.stat_result) -> str:
    return (f"{info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino} "
            f"{info.st_dev}")


def file_stamp(path: Path) -> str | None:
    """The stamp of the regular file at *path* as it is now (size, mtime, ctime, inode and
    device: what the cache records when it has proven an entry's bytes); None when there is
    no regular file there."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return _stamp_of(info) if _regular(info) else None


def check_file(path: Path, digest: Digest, stamp: str | None) -> str | None:
    """The cache's rule, for a file outside it that was proven once to hold *digest*'s bytes
    and stamped (*stamp*, None when never): trusted unread while its stamp is unchanged,
    else re-hashed. Its stamp now when it holds *digest*'s bytes, else None."""
    before = file_stamp(path)
    if before is None or before == stamp:
        return before
    try:
        good = digest_file(path, with_sha256=False).xxh3 == digest
    except OSError:
        return None
    return before if good and file_stamp(path) == before else None


class BlobCache:
    def __init__(self, root: Path, legacy: Iterable[Path] = ()) -> None:
        self.root = root
        self.legacy = tuple(legacy)
        """Older cache roots (same layout): their entries are re-hashed and moved into
        *root* when a fetch needs them."""

    def path(self, digest: Digest) -> Path:
        return self._path_in(self.root, digest)

    @staticmethod
    def _path_in(root: Path, digest: Digest) -> Path:
        if digest.algorithm != FOLDER:
            raise ValueError(f"the cache holds xxh3-128 blobs, not {digest}")
        return root / FOLDER / digest.hex[:2] / digest.hex[2:]

    def manifest_path(self, digest: Digest) -> Path:
        return self._manifest_in(self.root, digest)

    @staticmethod
    def _manifest_in(root: Path, digest: Digest) -> Path:
        if digest.algorithm != "sha256":
            raise ValueError(f"manifests are named by sha256, not {digest}")
        return root.joinpath(*MANIFESTS.split("/"), f"{digest.hex}.json")

    def manifest(self, digest: Digest) -> bytes | None:
        """The bytes of the copy of manifest *digest*, when there is one and they still
        hash to *digest*; a copy that does not is removed (None). A copy found only in an
        older cache place is moved here."""
        for root in (self.root, *self.legacy):
            copy = self._manifest_in(root, digest)
            try:
                data = copy.read_bytes()
            except OSError:  # none, or unreadable: the store has it
                continue
            good = sha256_of(data) == digest
            if good and root != self.root:
                self.keep_manifest(digest, data)
            if root != self.root or not good:
                with contextlib.suppress(OSError):
                    copy.unlink()
            if good:
                return data
        return None

    def keep_manifest(self, digest: Digest, data: bytes) -> None:
        """Keep a copy of *data*, the verified bytes of manifest *digest* (whole or not at
        all: written to a temp name, then renamed). A cache that cannot be written only
        costs the next fetch a store request."""
        if sha256_of(data) != digest:
            raise ValueError(f"these bytes are not manifest {digest}")
        copy = self.manifest_path(digest)
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            with _writing(copy.parent) as temp:
                temp.write_bytes(data)
                temp.chmod(0o444)
                temp.replace(copy)
        except OSError:
            pass

    def _stamp_path(self, entry: Path) -> Path:
        return entry.with_name(f".{entry.name}.verified")

    def verified(self, digest: Digest, size: int) -> Path | None:
        """The entry for *digest*, proven to hold its bytes; None when there is none (a
        changed entry that no longer hashes to *digest* is evicted first). An entry found
        only in an older cache place is re-hashed and moved here."""
        entry = self.path(digest)
        try:
            info = entry.lstat()
        except FileNotFoundError:
            return self._adopt(digest, size)
        if not _regular(info) or info.st_size != size:
            self.evict(digest)
            return None
        if self._read_stamp(entry) == _stamp_of(info):
            return entry
        return entry if self._recheck(digest, entry) else None

    def _recheck(self, digest: Digest, entry: Path) -> bool:
        """Re-hash an entry whose stamp does not match; stamp or evict it."""
        try:
            # read, not mapped: an entry someone changed may also be truncated under us
            good = digest_file(entry, with_sha256=False).xxh3 == digest
        except FileNotFoundError:
            return False
        if good:
            self._stamp(entry)
        else:
            self.evict(digest)
        return good

    def _adopt(self, digest: Digest, size: int) -> Path | None:
        for root in self.legacy:
            old = self._path_in(root, digest)
            try:
                if old.stat().st_size != size or digest_file(
                        old, with_sha256=False).xxh3 != digest:
                    continue
            except FileNotFoundError:
                continue
            entry = self.path(digest)
            entry.parent.mkdir(parents=True, exist_ok=True)
            try:
                old.replace(entry)
            except OSError:  # another file system: copy it over, verified again
                self.fill(digest, functools.partial(_copy_verified, old, digest=digest))
                with contextlib.suppress(OSError):
                    old.unlink()
            else:
                with contextlib.suppress(OSError):
                    entry.chmod(0o444)
                self._stamp(entry)
            with contextlib.suppress(OSError):
                self._stamp_path(old).unlink()
            return entry
        return None

    def place(self, digest: Digest, target: Path) -> bool:
        """Hard-link the entry to *target* (a copy where links do not work) if it is still
        the entry last verified; False (nothing placed) when it changed and no longer holds
        the digest's bytes (it is evicted)."""
        entry = self.path(digest)
        try:
            info = entry.lstat()
        except FileNotFoundError:
            return False
        if self._read_stamp(entry) != _stamp_of(info) and not self._recheck(digest, entry):
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(entry, target)
        except OSError:
            import shutil

            shutil.copyfile(entry, target)
            return True
        self._stamp(entry)  # the new link changed the entry's ctime
        return True

    def fill(self, digest: Digest, write: Callable[[Path], None]) -> Path:
        """Run *write(temp_path)* (which must verify what it writes), then publish the entry."""
        final = self.path(digest)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with _writing(final.parent) as temp:
                write(temp)
                temp.chmod(0o444)
                temp.replace(final)
        except (OSError, RegistryError) as exc:
            if _disk_full(exc):
                raise DiskFullError(self.root, "the fetch cache") from exc
            raise
        self._stamp(final)
        return final

    def evict(self, digest: Digest) -> None:
        entry = self.path(digest)
        for path in (self._stamp_path(entry), entry):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _read_stamp(self, entry: Path) -> str | None:
        try:
            return self._stamp_path(entry).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return None

    def _stamp(self, entry: Path) -> None:
        """Record the entry's inode as it is now, as verified (atomically, so two fetches
        stamping at once leave one whole stamp)."""
        try:
            stamp = _stamp_of(entry.lstat())
        except FileNotFoundError:
            return
        try:
            with _writing(entry.parent) as temp:
                temp.write_text(stamp, encoding="ascii")
                temp.replace(self._stamp_path(entry))
        except OSError as exc:
            if _disk_full(exc):
                raise DiskFullError(self.root, "the fetch cache") from exc
            raise

    def remove_partial(self, before: datetime, *, dry_run: bool = False) -> int:
        """Temp files (`.tmp-*`) of writers killed before *before*: a fetch that was
        interrupted resumes from its finished entries, never from these. One a live writer
        holds locked stays, whatever its age. Only `xxh3-128/` (here and in the older cache
        places) and `manifests/` are looked at. Their count (removed, or under *dry_run* to
        be)."""
        manifests = self.root.joinpath(*MANIFESTS.split("/"))
        removed = 0
        for prefix, cutoff in ((".tmp-", before),
                               (".new-", min(before, datetime.now(UTC) - NEW_GRACE))):
            paths = [path for root in (self.root, *self.legacy)
                     for path in (root / FOLDER).glob(f"*/{prefix}*")]
            paths += manifests.glob(f"{prefix}*")
            removed += sum(_remove_abandoned(path, cutoff, dry_run=dry_run) for path in paths)
        return removed

    def count(self, digests: Iterable[Digest]) -> int:
        """How many of *digests* have an entry here (unverified: for messages)."""
        return sum(1 for digest in digests if self.path(digest).is_file())


def _disk_full(exc: BaseException) -> bool:
    """Whether *exc* (or what it was raised from: a store translates the OSError of writing
    the temp file it was handed) is a full disk or quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _regular(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode)


@contextlib.contextmanager
def _writing(folder: Path) -> Iterator[Path]:
    """A new temp file `.tmp-<hex>` in *folder*, empty, held under an exclusive flock until
    the block ends (then removed, unless the block renamed it away). It is created as
    `.new-<hex>` and renamed once locked (module doc); one a gc removed in between is given
    up for a new one."""
    while True:
        name = uuid.uuid4().hex
        new, temp = folder / f".new-{name}", folder / f".tmp-{name}"
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                new.rename(temp)  # named .tmp- only once locked (module doc)
            except FileNotFoundError:
                continue  # a gc took it as a killed writer's, however unlikely
            if _names(temp, fd):
                try:
                    yield temp
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        temp.unlink()  # while still locked: gc never sees it unlocked
                return
        finally:
            os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether *path* names the file open as *fd*."""
    try:
        named, held = path.stat(), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev)


def _remove_abandoned(path: Path, before: datetime, *, dry_run: bool) -> bool:
    """Remove the temp file *path* when it is a regular file last modified before *before*
    and no live writer holds its lock (a killed one holds none); whether it was (or, under
    *dry_run*, would be). The lock is held while it is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone meanwhile, a link, or not ours to read
        return False
    try:
        info = os.fstat(fd)
        if not _regular(info) or datetime.fromtimestamp(info.st_mtime, UTC) >= before:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a writer at work (a fetch stalled mid-blob, say)
        if not _names(path, fd):
            return False  # renamed into place meanwhile: the writer finished
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return True
    finally:
        os.close(fd)


def _copy_verified(source: Path, temp: Path, *, digest: Digest) -> None:
    import shutil

    from registry.errors import IntegrityError

    shutil.copyfile(source, temp)
    actual = digest_file(temp, with_sha256=False).xxh3
    if actual != digest:
        raise IntegrityError(str(source), expected=digest, actual=actual)
