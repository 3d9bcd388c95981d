"""The content-addressed store: one interface, two backends.

    file:///abs/path       `registry.filestore.FileStore` (the embedded default)
    s3://bucket/prefix     `registry.s3store.S3Store` (AWS, MinIO, R2, Ceph, a test server)

Both use `registry.layout`. Blobs are keyed by xxh3-128 and verified while they are read;
manifests are keyed by sha256 and verified on the way in and out. Every write is idempotent
and atomic: an object is either absent or complete under its final name.

This module stays cheap to import: boto3 is imported only when an `s3://` store is opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import unquote, urlsplit

from registry.digest import Digest
from registry.errors import StoreError

WORKERS: Final = min(16, 2 * (os.cpu_count() or 2))
"""How many blobs a publish, fetch or fsck moves at once."""

Progress = Callable[[int], None]
"""Called with the number of bytes moved since the last call (negative when a part is retried)."""


@dataclass(frozen=True, slots=True)
class BlobInfo:
    digest: Digest
    size: int
    modified: datetime
    """When the blob was written, timezone-aware UTC."""


class Store(Protocol):
    """What every store backend offers. Safe to share between threads."""

    url: str

    def has_blob(self, digest: Digest) -> bool: ...

    def missing_blobs(self, digests: Iterable[Digest]) -> set[Digest]:
        """The subset of *digests* that the store does not hold."""

    def put_blob(self, digest: Digest, source: Path, *, progress: Progress | None = None) -> None:
        """Store *source*'s bytes as *digest*; a no-op when the blob is already there."""

    def get_blob(
        self,
        digest: Digest,
        dest: Path,
        *,
        size: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Write the blob to *dest* (a temp path), verifying xxh3-128 while streaming.

        On any failure (IntegrityError included) *dest* is removed. *size*, when known,
        lets a backend plan parallel ranged reads without asking first."""

    def put_manifest(self, digest: Digest, data: bytes) -> None:
        """Store *data* as *digest* after checking sha256(data) == digest; idempotent."""

    def get_manifest(self, digest: Digest) -> bytes:
        """The manifest's bytes, verified; NotFoundError when absent."""

    def has_manifest(self, digest: Digest) -> bool: ...

    def iter_manifests(self) -> Iterator[Digest]: ...

    def iter_blobs(self) -> Iterator[BlobInfo]: ...

    def delete_blob(self, digest: Digest) -> None:
        """Remove the blob; a no-op when absent."""

    def delete_manifest(self, digest: Digest) -> None:
        """Remove the manifest; a no-op when absent."""

    def remove_partial(self, before: datetime, *, dry_run: bool = False) -> int:
        """Remove what killed writers left half-written before *before* (temp files, S3
        multipart uploads never completed); returns how many. Never a finished object."""


def open_store(url: str, *, s3_endpoint_url: str | None = None) -> Store:
    """Open the store at *url* (`file:///abs/path` or `s3://bucket/prefix`).

    Nothing is contacted or created here; the first operation does that."""
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
        from registry.filestore import FileStore

        return FileStore(root)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StoreError(f"store URL {url!r} has no bucket: s3://bucket/prefix", url=url)
        from registry.s3store import S3Store

        return S3Store(parts.netloc, unquote(parts.path), endpoint_url=s3_endpoint_url)
    raise StoreError(
        f"unknown store URL scheme {parts.scheme!r} in {url!r}; "
        "use file:///absolute/path or s3://bucket/prefix (ENGINECTL_STORE_URL)",
        url=url,
    )
