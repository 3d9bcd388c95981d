"""The content-addressed store's interface, which two backends implement:

    file:///abs/path       `registry.store.filestore.FileStore` (the embedded default)
    s3://bucket/prefix     `registry.store.s3store.S3Store` (AWS, MinIO, R2, Ceph, a test server)

`registry.store.opener.open_store` opens one from its URL. Both use `registry.identity.layout`.
Blobs are keyed by xxh3-128 and verified while they are read; manifests are keyed by sha256 and
verified on the way in and out. Every write is idempotent and atomic: an object is either
absent or complete under its final name. An existing object is trusted only as far as a cheap
check goes: a blob of the wrong size counts as missing (and is replaced), a stored manifest is
compared byte for byte (and replaced when it differs).

Small immutable records (`registry.ops.history`) and objects set aside as damaged
(`registry.ops.damage`) use the generic `put_object`/`get_object`/`list_objects`/`move_object`/
`delete_object`, with keys from `registry.identity.layout`.

This module stays cheap to import: boto3 is imported only when an `s3://` store is opened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from registry.errors import IntegrityError, StoppedError
from registry.identity.digest import Algorithm, Digest

Progress = Callable[[int], None]
"""Called with the number of bytes moved since the last call (negative when a part is retried)."""
InFlight = Callable[[], Container[Digest]]
"""The blobs publishes in flight are writing (`registry.ops.pending`), for `remove_partial`."""


@dataclass(frozen=True, slots=True)
class BlobInfo:
    digest: Digest
    size: int
    modified: datetime
    """When the blob was written, timezone-aware UTC."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    """Relative to the store's root or prefix."""
    size: int
    modified: datetime


Vouch = Literal["stored", "altered", "unknown"]
"""What a store says of bytes read back (`ReadBack.vouch`)."""


@dataclass(frozen=True, slots=True)
class ReadBack:
    """A whole read of a stored object made to judge it (`Store.read_back`), and whether the
    store vouches that the bytes read are the bytes it holds."""

    digest: Digest
    """What the bytes read hash to, in the algorithm asked for."""
    vouch: Vouch
    """"stored": the store's own record of the object matches the bytes read (S3: the
    checksum or MD5 ETag the server computed when the object was written; a file store:
    the file itself was read), so they are what it holds; "altered": the server's record
    does not match them, so they changed after it sent them (on the way); "unknown": the
    server keeps nothing to compare them with."""
    evidence: str
    """What was compared, for messages (`the server's CRC32 …`)."""


def hash_for(algorithm: Algorithm) -> Hash:
    """A fresh hash object of *algorithm* (its `hexdigest()` is a `Digest`'s hex)."""
    import hashlib

    import xxhash

    return xxhash.xxh3_128() if algorithm == "xxh3-128" else hashlib.sha256()


class Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def check_stop(stop: threading.Event | None) -> None:
    """Raise StoppedError once *stop* is set: long transfers call this between chunks."""
    if stop is not None and stop.is_set():
        raise StoppedError("stopped")


def write_verified(dest: Path, digest: Digest, where: str, write: Callable[[], Digest]) -> None:
    """Run *write*, which fills *dest* and returns the xxh3-128 of what it wrote: a backend's
    `get_blob`. *dest* is removed when *write* fails or stops, or when what it wrote is not
    *digest* (IntegrityError naming *where*, the stored blob), so no bad file is left."""
    try:
        actual = write()
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if actual != digest:
        dest.unlink(missing_ok=True)
        raise IntegrityError(where, expected=digest, actual=actual)


def sizes_of(digests: Iterable[Digest] | Mapping[Digest, int]) -> dict[Digest, int | None]:
    """*digests* as digest → expected size (None: any size)."""
    if isinstance(digests, Mapping):
        return dict(digests)
    return dict.fromkeys(digests)


class Store(Protocol):
    """What every store backend offers. Safe to share between threads."""

    url: str

    def has_blob(self, digest: Digest) -> bool: ...

    def missing_blobs(self, digests: Iterable[Digest] | Mapping[Digest, int]) -> set[Digest]:
        """The digests the store does not hold; given a mapping to sizes, also those whose
        stored blob has another size (truncated, or not what it claims)."""

    def put_blob(self, digest: Digest, source: Path, *, progress: Progress | None = None,
                 stop: threading.Event | None = None) -> None:
        """Store *source*'s bytes as *digest*; a no-op when a blob of *source*'s size is
        already there (one of another size is replaced)."""

    def get_blob(
        self,
        digest: Digest,
        dest: Path,
        *,
        size: int | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Write the blob to *dest* (a temp path), verifying xxh3-128 while streaming.

        On any failure (IntegrityError included) *dest* is removed. *size*, when known,
        lets a backend plan parallel ranged reads without asking first; a stored blob of
        another size is an IntegrityError. Once *stop* is set the transfer ends at its next
        chunk with StoppedError."""

    def read_back(self, key: str, algorithm: Algorithm) -> ReadBack:
        """Read the object at *key* (a blob or a manifest) whole again, by a path other
        than `get_blob`'s fast one, hashing it with *algorithm*, and say whether the store
        vouches for those bytes (`ReadBack`): how `registry.ops.damage` tells damaged
        storage from a corrupted transfer. NotFoundError when absent; StoreError when the
        read fails."""

    def put_manifest(self, digest: Digest, data: bytes) -> None:
        """Store *data* as *digest* after checking sha256(data) == digest; idempotent, and a
        stored manifest that differs from *data* (damaged) is replaced."""

    def get_manifest(self, digest: Digest) -> bytes:
        """The manifest's bytes, verified; NotFoundError when absent."""

    def has_manifest(self, digest: Digest) -> bool: ...

    def iter_manifests(self) -> Iterator[Digest]: ...

    def iter_blobs(self) -> Iterator[BlobInfo]: ...

    def delete_blob(self, digest: Digest) -> None:
        """Remove the blob; a no-op when absent."""

    def delete_manifest(self, digest: Digest) -> None:
        """Remove the manifest; a no-op when absent."""

    def remove_partial(self, before: datetime, *, dry_run: bool = False,
                       in_flight: InFlight | None = None) -> int:
        """Remove what killed writers left half-written before *before* (temp files, S3
        multipart uploads never completed); returns how many. Never a finished object, nor
        a half-written blob that `in_flight()`, asked once they are listed, names."""

    def put_object(self, key: str, data: bytes) -> None:
        """Write a small object (a record) whole under *key*."""

    def get_object(self, key: str) -> bytes:
        """A small object's bytes; NotFoundError when absent."""

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under *prefix* (ending in `/`), in key order; callers parse keys."""

    def move_object(self, key: str, new_key: str) -> bool:
        """Move an object (a damaged blob or manifest, set aside); False when absent."""

    def delete_object(self, key: str) -> None:
        """Remove an object; a no-op when absent."""
