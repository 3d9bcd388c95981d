"""The `file://` store backend: the layout of `registry.identity.layout` under a local folder.

Writes go to a hidden temp file beside the final name, are fsynced, then `os.replace`d into
place (and the folder fsynced), so a crash never leaves a partial object under its final
name; the strict key parser makes every listing skip those temp files. Stored files are
made read-only. A damaged object is set aside by a rename into `damaged/`. OS errors become
`StoreError` with the path.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

import xxhash

from registry.errors import IntegrityError, NotFoundError, StoreError
from registry.identity.digest import (
    Algorithm,
    Digest,
    release_mapped,
    sha256_of,
    update_mapped,
)
from registry.identity.layout import (
    BLOBS,
    MANIFESTS,
    blob_name,
    manifest_name,
    parse_blob_name,
    parse_manifest_name,
)
from registry.store.base import (
    BlobInfo,
    InFlight,
    ObjectInfo,
    Progress,
    ReadBack,
    check_stop,
    hash_for,
    sizes_of,
    write_verified,
)

COPY_CHUNK: Final = 4 << 20
KERNEL_STEP: Final = 1 << 20
"""copy_file_range is asked for this much at a time, and it is hashed from the copy's pages
right after, while they are still in the CPU's cache (10-15 % less CPU and time than
copying a whole file, then hashing it: bench/README.md, `fetch_file.py`); a stopped fetch
ends within one step."""


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _atomic_write(final: Path) -> Iterator[IO[bytes]]:
    """Yield a temp file beside *final*; on success make it read-only and rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f".{final.name}.{secrets.token_hex(8)}.tmp")
    try:
        with temp.open("xb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        temp.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        temp.replace(final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)


def _kernel_copy_hashing(
    source: IO[bytes], dest: IO[bytes], progress: Progress | None,
    stop: threading.Event | None = None,
) -> Digest | None:
    """Copy inside the kernel (copy_file_range: no user-space copy, reflinks where the file
    system has them), KERNEL_STEP at a time, each step hashed from *dest*'s pages through
    mmap right after it landed, which verifies the copy itself; a stop is noticed between
    steps. None when the kernel cannot copy between these files: use the read loop."""
    size = os.fstat(source.fileno()).st_size
    hasher = xxhash.xxh3_128()
    if size == 0:
        return Digest("xxh3-128", hasher.hexdigest())
    src, dst = source.fileno(), dest.fileno()
    os.ftruncate(dst, size)  # the whole file is mapped before the first byte lands
    copied = released = 0
    with mmap.mmap(dst, size, access=mmap.ACCESS_READ) as region:
        while copied < size:
            check_stop(stop)
            try:
                moved = os.copy_file_range(src, dst, min(size - copied, KERNEL_STEP),
                                           copied, copied)
            except OSError:
                if copied:
                    raise
                os.ftruncate(dst, 0)  # the read loop writes it from the start
                return None
            if moved == 0:
                raise OSError(f"copied {copied} of {size} bytes: the source ended early")
            update_mapped(region, copied, copied + moved, hasher, release=False)
            copied += moved
            released = release_mapped(region, released, copied, final=copied == size)
            if progress is not None:
                progress(moved)
    return Digest("xxh3-128", hasher.hexdigest())


def _copy_hashing(source: IO[bytes], dest: IO[bytes], progress: Progress | None,
                  stop: threading.Event | None = None) -> Digest:
    hasher = xxhash.xxh3_128()
    while chunk := source.read(COPY_CHUNK):
        check_stop(stop)
        hasher.update(chunk)
        dest.write(chunk)
        if progress is not None:
            progress(len(chunk))
    return Digest("xxh3-128", hasher.hexdigest())


def _check_size(source: IO[bytes], size: int | None, where: str, digest: Digest) -> None:
    found = os.fstat(source.fileno()).st_size
    if size is not None and found != size:
        raise IntegrityError(where, expected=digest, actual=None,
                             detail=f"{found} bytes where {size} are expected")


def remove_stale(paths: Iterable[Path], before: datetime, *, dry_run: bool = False) -> int:
    """Remove the regular files among *paths* last modified before *before*; their count."""
    count = 0
    for path in paths:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and datetime.fromtimestamp(info.st_mtime, UTC) < before:
            count += 1
            if not dry_run:
                path.unlink(missing_ok=True)
    return count


class FileStore:
    """A store rooted at a local folder; created on the first write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    @contextmanager
    def _os_errors(self, operation: str, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            where = exc.filename if exc.filename is not None else self._path(key)
            raise StoreError(
                f"{operation} failed on {where}: {exc.strerror or exc}",
                url=self.url,
                key=key,
                operation=operation,
            ) from exc

    # blobs

    def has_blob(self, digest: Digest) -> bool:
        return self._path(blob_name(digest)).is_file()

    def _blob_size(self, digest: Digest) -> int | None:
        try:
            info = self._path(blob_name(digest)).lstat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None

    def missing_blobs(self, digests: Iterable[Digest] | Mapping[Digest, int]) -> set[Digest]:
        sizes = sizes_of(digests)
        return {digest for digest, size in sizes.items()
                if (found := self._blob_size(digest)) is None
                or (size is not None and found != size)}

    def put_blob(self, digest: Digest, source: Path, *, progress: Progress | None = None,
                 stop: threading.Event | None = None) -> None:
        key = blob_name(digest)
        final = self._path(key)
        with self._os_errors("put_blob", key):
            if self._blob_size(digest) == source.stat().st_size:
                return  # the same size: trusted (a flipped byte is fetch's and fsck's to find)
            with source.open("rb") as src, _atomic_write(final) as handle:
                actual = _copy_hashing(src, handle, progress, stop)
                if actual != digest:  # the temp file is removed; nothing lands under the key
                    raise IntegrityError(str(source), expected=digest, actual=actual)

    def get_blob(
        self,
        digest: Digest,
        dest: Path,
        *,
        size: int | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        key = blob_name(digest)
        path = self._path(key)

        def write() -> Digest:
            with self._os_errors("get_blob", key):
                try:
                    src = path.open("rb")
                except FileNotFoundError as exc:
                    raise NotFoundError(f"blob {digest}", url=self.url, key=key) from exc
                with src, dest.open("w+b") as out:
                    _check_size(src, size, str(path), digest)
                    actual = _kernel_copy_hashing(src, out, progress, stop)
                    if actual is None:
                        actual = _copy_hashing(src, out, progress, stop)
                    return actual

        write_verified(dest, digest, str(path), write)

    def read_back(self, key: str, algorithm: Algorithm) -> ReadBack:
        """The file read again from the disk: its bytes are the store's own, whatever they
        hash to."""
        hasher = hash_for(algorithm)
        with self._os_errors("read_back", key):
            try:
                src = self._path(key).open("rb")
            except FileNotFoundError as exc:
                raise NotFoundError(f"object {key}", url=self.url, key=key) from exc
            with src:
                while chunk := src.read(COPY_CHUNK):
                    hasher.update(chunk)
        return ReadBack(Digest(algorithm, hasher.hexdigest()), "stored",
                        f"the file {self._path(key)} read again")

    def iter_blobs(self) -> Iterator[BlobInfo]:
        for key, entry in self._scan(BLOBS, depth=2):
            try:
                digest = parse_blob_name(key)
                info = entry.stat(follow_symlinks=False)
            except (ValueError, FileNotFoundError):
                continue
            if stat.S_ISREG(info.st_mode):
                modified = datetime.fromtimestamp(info.st_mtime, UTC)
                yield BlobInfo(digest=digest, size=info.st_size, modified=modified)

    def remove_partial(self, before: datetime, *, dry_run: bool = False,
                       in_flight: InFlight | None = None) -> int:
        """Temp files (`.<name>.<hex>.tmp`) of writers killed before *before*; not those
        of blobs `in_flight()` names (asked once the temp files are listed)."""
        temps = list(self.root.rglob(".*.tmp"))
        if in_flight is not None and temps:
            writing = in_flight()
            temps = [temp for temp in temps if self._blob_of(temp) not in writing]
        return remove_stale(temps, before, dry_run=dry_run)

    def _blob_of(self, temp: Path) -> Digest | None:
        """The blob a temp file `.<name>.<hex>.tmp` was to become; None if not a blob's."""
        try:
            final = temp.with_name(temp.name[1:].rsplit(".", 2)[0])
            return parse_blob_name(final.relative_to(self.root).as_posix())
        except ValueError:
            return None

    def delete_blob(self, digest: Digest) -> None:
        key = blob_name(digest)
        with self._os_errors("delete_blob", key):
            self._path(key).unlink(missing_ok=True)

    # manifests

    def has_manifest(self, digest: Digest) -> bool:
        return self._path(manifest_name(digest)).is_file()

    def put_manifest(self, digest: Digest, data: bytes) -> None:
        key = manifest_name(digest)
        final = self._path(key)
        actual = sha256_of(data)
        if actual != digest:
            raise IntegrityError(f"manifest data for {final}", expected=digest, actual=actual)
        with self._os_errors("put_manifest", key):
            try:
                if final.read_bytes() == data:
                    return  # verified: manifests are small enough to compare every time
            except (FileNotFoundError, IsADirectoryError):
                pass
            with _atomic_write(final) as handle:  # absent, or damaged: replaced whole
                handle.write(data)

    def get_manifest(self, digest: Digest) -> bytes:
        key = manifest_name(digest)
        path = self._path(key)
        with self._os_errors("get_manifest", key):
            try:
                data = path.read_bytes()
            except FileNotFoundError as exc:
                raise NotFoundError(f"manifest {digest}", url=self.url, key=key) from exc
        actual = sha256_of(data)
        if actual != digest:
            raise IntegrityError(str(path), expected=digest, actual=actual)
        return data

    def iter_manifests(self) -> Iterator[Digest]:
        for key, _entry in self._scan(MANIFESTS, depth=1):
            try:
                yield parse_manifest_name(key)
            except ValueError:
                continue

    def delete_manifest(self, digest: Digest) -> None:
        key = manifest_name(digest)
        with self._os_errors("delete_manifest", key):
            self._path(key).unlink(missing_ok=True)

    # small objects (records) and objects set aside

    def put_object(self, key: str, data: bytes) -> None:
        final = self._path(key)
        with self._os_errors("put_object", key), _atomic_write(final) as handle:
            handle.write(data)

    def get_object(self, key: str) -> bytes:
        path = self._path(key)
        with self._os_errors("get_object", key):
            try:
                return path.read_bytes()
            except FileNotFoundError as exc:
                raise NotFoundError(f"object {key}", url=self.url, key=key) from exc

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every regular file under *prefix* (a folder key ending in `/`), in key order;
        temp files are listed too (callers parse keys strictly)."""
        top = self._path(prefix.rstrip("/"))
        for directory, subdirs, files in os.walk(top):
            subdirs.sort()
            for name in sorted(files):
                path = Path(directory) / name
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    key = path.relative_to(self.root).as_posix()
                    yield ObjectInfo(key, info.st_size, datetime.fromtimestamp(info.st_mtime, UTC))

    def move_object(self, key: str, new_key: str) -> bool:
        """Rename *key* to *new_key* (same file system: atomic); False when absent."""
        source, target = self._path(key), self._path(new_key)
        with self._os_errors("move_object", key):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                source.rename(target)
            except FileNotFoundError:
                return False
            _fsync_dir(source.parent)
        return True

    def delete_object(self, key: str) -> None:
        with self._os_errors("delete_object", key):
            self._path(key).unlink(missing_ok=True)

    # listing

    def _scan(self, prefix: str, *, depth: int) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """(key, entry) for every entry *depth* levels below *prefix*, in key order."""
        try:
            with os.scandir(self._path(prefix.rstrip("/"))) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            key = f"{prefix}{entry.name}"
            if depth == 1:
                yield key, entry
            elif entry.is_dir(follow_symlinks=False):
                yield from self._scan(f"{key}/", depth=depth - 1)
