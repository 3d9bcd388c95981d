"""The content-addressed store: one interface, two backends.

    file:///abs/path       `registry.filestore.FileStore` (the embedded default)
    s3://bucket/prefix     `registry.s3store.S3Store` (AWS, MinIO, R2, Ceph, a test server)

Both use `registry.layout`. Blobs are keyed by xxh3-128 and verified while they are read;
manifests are keyed by sha256 and verified on the way in and out. Every write is idempotent
and atomic: an object is either absent or complete under its final name. An existing object
is trusted only as far as a cheap check goes: a blob of the wrong size counts as missing
(and is replaced), a stored manifest is compared byte for byte (and replaced when it differs).

Small immutable records (`registry.history`) and objects set aside as damaged
(`registry.damage`) use the generic `put_object`/`get_object`/`list_objects`/`move_object`/
`delete_object`, with keys from `registry.layout`.

This module stays cheap to import: boto3 is imported only when an `s3://` store is opened.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import unquote, urlsplit

from registry.digest import Digest
from registry.errors import ConfigError, StoppedError, StoreError

WORKERS: Final = min(16, 2 * (os.cpu_count() or 2))
"""How many blobs a publish, fetch or fsck moves at once."""

Progress = Callable[[int], None]
"""Called with the number of bytes moved since the last call (negative when a part is retried)."""
InFlight = Callable[[], Container[Digest]]
"""The blobs publishes in flight are writing (`registry.pending`), for `remove_partial`."""


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


def check_stop(stop: threading.Event | None) -> None:
    """Raise StoppedError once *stop* is set: long transfers call this between chunks."""
    if stop is not None and stop.is_set():
        raise StoppedError("stopped")


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


def check_endpoint_url(url: str) -> str:
    """*url* when it is an http(s) endpoint (`http://host:port`); ConfigError otherwise."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok \
            or parts.query or parts.fragment:
        raise ConfigError(
            f"ENGINECTL_S3_ENDPOINT_URL {url!r} is not an endpoint URL: expected "
            "http(s)://host[:port], e.g. http://127.0.0.1:9000 (unset it for AWS)",
            variable="ENGINECTL_S3_ENDPOINT_URL", value=url,
        )
    return url


def open_store(url: str, *, s3_endpoint_url: str | None = None) -> Store:
    """Open the store at *url* (`file:///abs/path` or `s3://bucket/prefix`).

    Nothing is contacted or created here; the first operation does that."""
    where = check_store_url(url, s3_endpoint_url=s3_endpoint_url)
    if isinstance(where, Path):
        from registry.filestore import FileStore

        return FileStore(where)
    from registry.s3store import S3Store

    bucket, prefix = where
    return S3Store(bucket, prefix, endpoint_url=s3_endpoint_url)


def check_store_url(url: str, *, s3_endpoint_url: str | None = None) -> Path | tuple[str, str]:
    """What `open_store` would open: a `file://` store's folder, or an S3 store's (bucket,
    prefix); StoreError or ConfigError as `open_store` raises them. Pure: nothing is
    imported or contacted, so a command that may never need its store (a refetch from the
    cache) still refuses a bad setting first."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise StoreError(f"store URL {url!r} must not have a query or fragment", url=url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreError(
                f"store URL {url!r} names host {parts.netloc!r}; use file:///absolute/path",
                url=url,
            )
        root = Path(unquote(parts.path))
        if not parts.path or not root.is_absolute():
            raise StoreError(f"store URL {url!r} needs an absolute path: file:///path", url=url)
        return root
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StoreError(f"store URL {url!r} has no bucket: s3://bucket/prefix", url=url)
        if s3_endpoint_url is not None:
            check_endpoint_url(s3_endpoint_url)
        return parts.netloc, unquote(parts.path)
    raise StoreError(
        f"unknown store URL scheme {parts.scheme!r} in {url!r}; "
        "use file:///absolute/path or s3://bucket/prefix (ENGINECTL_STORE_URL)",
        url=url,
    )
