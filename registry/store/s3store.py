"""The `s3://bucket/prefix` store backend (AWS, MinIO, R2, Ceph, a test server).

- A blob below `upload_part_size` is one PUT; a larger one is a multipart upload whose parts
  run on one pool of `upload_threads` shared by all the blobs of a publish
  (`registry.store.s3upload`); every PUT carries a CRC32 checksum that S3 checks, and
  manifests carry their own sha256 as the checksum, so S3 checks their digest too.
- Every blob is read as ranged GETs of `download_part_size` (a small blob is one), run on
  one pool of `download_threads` shared by all the blobs of a fetch; each GET streams into
  the file at its offset (over plain http spliced there by the kernel, `registry.store.s3splice`;
  else in 1 MiB chunks), hashed from the file's pages in order as they land
  (`registry.store.ranges.InOrderHash`): verification overlaps the download, memory is flat.
  The GETs (blobs and manifests) go through obstore (`registry.store.s3get`: bytes move in Rust,
  not in Python socket reads); everything else goes through boto3 (`registry.store.s3bucket`),
  imported on the first such call, so a fetch whose credentials are in the environment
  never imports it.
- `missing_blobs` groups digests by their 2-hex shard: a few per shard are HEADed, more are
  found with one LIST of just the key range needed; shards are asked in parallel.

Only `registry.store.opener.open_store` imports this module, so boto3 stays off the `--help` path.
"""

from __future__ import annotations

import base64
import mmap
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Final

import xxhash

from registry.errors import IntegrityError, NotFoundError, StoreError
from registry.identity.digest import Algorithm, Digest, sha256_of
from registry.identity.layout import (
    BLOBS,
    MANIFESTS,
    blob_name,
    blob_shard,
    manifest_name,
    parse_blob_name,
    parse_manifest_name,
    s3_url,
)
from registry.store.base import BlobInfo, InFlight, ObjectInfo, Progress, sizes_of, write_verified
from registry.store.ranges import InOrderHash, MappedHash, read_ranges, split
from registry.store.s3upload import Uploader
from registry.workers import Workers

if TYPE_CHECKING:
    from registry.store.base import ReadBack
    from registry.store.s3bucket import Bucket
    from registry.store.s3get import RangeReader

MiB: Final = 1 << 20
DOWNLOAD_THREADS: Final = min(64, 12 * (os.cpu_count() or 2))
"""Ranged GETs in flight for a whole fetch: a spliced GET costs the client nothing while it
waits, and on 2 vCPUs 24 took less client and s3rver CPU than 8 or 16 (bench/README.md)."""
OBSTORE_THREADS: Final = min(64, max(8, 4 * (os.cpu_count() or 2)))
"""The same when obstore moves the bodies (https): each GET holds its own buffers."""
HEAD_AT_MOST: Final = 3
"""Per shard: up to this many wanted blobs are HEADed; more are found with one LIST."""


class S3Store:
    """A store under `s3://bucket/prefix`; safe to share between threads.

    Defaults are tuned for throughput on one host (DOWNLOAD_THREADS ranged reads of 32 MiB
    parts in flight for the whole store, 8 × 64 MiB upload parts); pass smaller numbers to
    be gentler on a small server. 32 MiB parts took s3rver 15 % less CPU than 16 MiB ones
    (bench/README.md)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        upload_part_size: int = 64 * MiB,
        upload_threads: int = 8,
        download_part_size: int = 32 * MiB,
        download_threads: int = DOWNLOAD_THREADS,
        stream_retries: int = 5,
    ) -> None:
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.download_part_size = download_part_size
        self.download_threads = download_threads
        self.bucket_name = bucket
        self.endpoint_url = endpoint_url
        self.stream_retries = stream_retries
        self.upload_part_size = upload_part_size
        self.upload_threads = upload_threads

    @cached_property
    def bucket(self) -> Bucket:
        """boto3's side of the bucket (control calls, uploads), made on first use."""
        from registry.store.s3bucket import Bucket

        return Bucket(
            self.bucket_name,
            store_url=self.url,
            endpoint_url=self.endpoint_url,
            pool_connections=2 * max(self.upload_threads, self.download_threads),
            stream_retries=self.stream_retries,
        )

    def where(self, key: str) -> str:
        return s3_url(self.bucket_name, key)

    def remove_partial(self, before: datetime, *, dry_run: bool = False,
                       in_flight: InFlight | None = None) -> int:
        """Multipart uploads under this store's prefix started before *before* and never
        completed (a killed publish); aborting them frees their parts. Not those of blobs
        `in_flight()` names (asked once the uploads are listed)."""
        from botocore.exceptions import BotoCoreError, ClientError  # boto3 is loaded by now

        client = self.bucket.client
        try:
            pages = client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket.name, Prefix=self._key(""))
            stale = [upload for page in pages for upload in page.get("Uploads", [])
                     if upload["Initiated"] < before]
            if in_flight is not None and stale:
                writing = in_flight()
                stale = [upload for upload in stale
                         if self._blob_of(upload["Key"]) not in writing]
            for upload in stale if not dry_run else []:
                client.abort_multipart_upload(Bucket=self.bucket.name, Key=upload["Key"],
                                              UploadId=upload["UploadId"])
        except (ClientError, BotoCoreError) as exc:
            raise self.bucket.error(exc, "list_multipart_uploads", self._key("")) from exc
        return len(stale)

    def _blob_of(self, key: str) -> Digest | None:
        """The blob under the bucket's *key*; None when it is not one of this store's."""
        strip = len(self._key(""))
        try:
            return parse_blob_name(key[strip:]) if key.startswith(self._key("")) else None
        except ValueError:
            return None

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint_url={self.endpoint_url!r})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    # blobs

    def has_blob(self, digest: Digest) -> bool:
        return self.bucket.exists(self._key(blob_name(digest)), "has_blob")

    def missing_blobs(self, digests: Iterable[Digest] | Mapping[Digest, int]) -> set[Digest]:
        wanted = sizes_of(digests)
        shards: dict[str, list[Digest]] = {}
        for digest in wanted:
            shards.setdefault(blob_shard(digest), []).append(digest)
        if not shards:
            return set()
        missing: set[Digest] = set()
        with ThreadPoolExecutor(min(len(shards), self.download_threads)) as pool:
            for group, present in zip(
                shards.values(), pool.map(self._present, shards.values()), strict=True
            ):
                missing.update(
                    digest for digest in group
                    if digest not in present
                    or (wanted[digest] is not None and present[digest] != wanted[digest])
                )
        return missing

    def _present(self, digests: list[Digest]) -> dict[Digest, int]:
        """Which of *digests* (all in one shard) the store holds, with their sizes."""
        if len(digests) <= HEAD_AT_MOST:
            sizes = {digest: self.bucket.size(self._key(blob_name(digest)), "has_blob")
                     for digest in digests}
            return {digest: size for digest, size in sizes.items() if size is not None}
        wanted = {self._key(blob_name(digest)): digest for digest in digests}
        first, last = min(wanted), max(wanted)
        present: dict[Digest, int] = {}
        prefix = self._key(blob_shard(digests[0]))
        for entry in self.bucket.list(prefix, start_after=first[:-1]):
            if entry["Key"] in wanted:
                present[wanted[entry["Key"]]] = int(entry["Size"])
            if entry["Key"] >= last:
                break
        return present

    def put_blob(self, digest: Digest, source: Path, *, progress: Progress | None = None,
                 stop: threading.Event | None = None) -> None:
        key = self._key(blob_name(digest))
        try:
            size = source.stat().st_size
        except OSError as exc:
            raise StoreError(f"put_blob {self.where(key)} cannot read {source}: "
                             f"{exc.strerror or exc}", url=self.url, key=key,
                             operation="put_blob") from exc
        if self.bucket.size(key, "put_blob") == size:
            return
        from botocore.exceptions import BotoCoreError, ClientError  # boto3 is loaded by now

        try:
            with source.open("rb") as handle:
                if size < self.upload_part_size:
                    self.bucket.client.put_object(Bucket=self.bucket.name, Key=key, Body=handle,
                                                  ChecksumAlgorithm="CRC32")
                    if progress is not None:
                        progress(size)
                else:
                    self._uploader.upload(key, handle.fileno(), size, self.upload_part_size,
                                          progress=progress, stop=stop)
        except (ClientError, BotoCoreError) as exc:
            raise self.bucket.error(exc, "put_blob", key) from exc
        except OSError as exc:
            raise StoreError(
                f"put_blob {self.where(key)} failed reading {source}: {exc.strerror or exc}",
                url=self.url,
                key=key,
                operation="put_blob",
            ) from exc

    @cached_property
    def _uploader(self) -> Uploader:
        """The multipart uploads of every blob this store publishes (`registry.store.s3upload`),
        made on the first one with the store's `upload_threads` and `upload_part_size`."""
        return Uploader(self.bucket, endpoint_url=self.endpoint_url,
                        threads=self.upload_threads, part_size=self.upload_part_size)

    def get_blob(
        self,
        digest: Digest,
        dest: Path,
        *,
        size: int | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        key = self._key(blob_name(digest))

        def write() -> Digest:
            # not O_TRUNC: truncating the cache's empty temp file arms ext4's auto_da_alloc, and
            # close then writes the whole blob back in this thread (bench/README.md, fetch_s3)
            fd = os.open(dest, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                return self._download(key, f"blob {digest}", fd, size, progress=progress,
                                      stop=stop, digest=digest)
            finally:
                os.close(fd)

        write_verified(dest, digest, self.where(key), write)

    @cached_property
    def _reader(self) -> RangeReader:
        """Blob bytes come through obstore (registry.store.s3get); imported on the first fetch."""
        from registry.store.s3get import RangeReader

        return RangeReader(self.bucket_name, self.url, self.endpoint_url, lambda: self.bucket,
                           stream_retries=self.stream_retries)

    @cached_property
    def _readers(self) -> Workers:
        """The ranged GETs of every blob this store fetches share these threads (fewer when
        obstore moves the bytes); daemons: a stopped fetch never waits for a blocked read."""
        most = self.download_threads if self._reader.splices else OBSTORE_THREADS
        return Workers(min(self.download_threads, most), name="s3-get")

    def _download(
        self, key: str, what: str, fd: int, size: int | None, *, progress: Progress | None,
        stop: threading.Event | None, digest: Digest,
    ) -> Digest:
        """Stream the object into *fd* with parallel ranged GETs on the shared readers and
        return the xxh3-128 of what landed, hashed from the file's pages in order as they
        land (`registry.store.ranges.InOrderHash`, `MappedHash`)."""

        def fetch(start: int, end: int) -> None:
            written = 0

            def landed(n: int) -> None:
                nonlocal written
                if progress is not None:
                    progress(n)
                written += n
                hashed.landed(start, start + written)

            seen_total = self._reader.read_into(key, what, fd, (start, end), size=total,
                                                 stop=stop, landed=landed)
            if seen_total != total:  # every answer said so: a suspicion, not yet a proof
                raise IntegrityError(self.where(key), expected=digest, actual=None,
                                     detail=f"{seen_total} bytes where {total} are expected")
            if written != end - start:
                raise StoreError(
                    f"get_blob {self.where(key)}: asked for bytes {start}-{end - 1}, "
                    f"got {written}", url=self.url, key=key, operation="get_blob",
                )

        part = self.download_part_size
        if size is None:  # a HEAD says how big the object is
            total = self.bucket.size(key, "get_blob")
            if total is None:
                raise NotFoundError(what, url=self.url, key=key)
        else:
            total = size
        hasher = xxhash.xxh3_128()
        os.ftruncate(fd, total)  # what the file held before goes (every byte is written)
        if total:
            with mmap.mmap(fd, total, access=mmap.ACCESS_READ) as region:
                hashed = InOrderHash(MappedHash(region, hasher))
                read_ranges(
                    split(0, total, part), fetch, lambda _first, end: hashed.upto(end),
                    pool=self._readers, window=self.download_threads,
                )
        return Digest("xxh3-128", hasher.hexdigest())

    def read_back(self, key: str, algorithm: Algorithm) -> ReadBack:
        """By boto3 on a client of its own, against the server's checksum (`s3check`)."""
        from registry.store.s3check import read_back

        return read_back(self.bucket, self._key(key), algorithm)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        strip = len(self._key(""))
        for entry in self.bucket.list(self._key(BLOBS)):
            try:
                digest = parse_blob_name(entry["Key"][strip:])
            except ValueError:
                continue
            modified = entry["LastModified"].astimezone(UTC)
            yield BlobInfo(digest=digest, size=entry["Size"], modified=modified)

    def delete_blob(self, digest: Digest) -> None:
        self.bucket.delete(self._key(blob_name(digest)))

    # manifests

    def has_manifest(self, digest: Digest) -> bool:
        return self.bucket.exists(self._key(manifest_name(digest)), "has_manifest")

    def put_manifest(self, digest: Digest, data: bytes) -> None:
        key = self._key(manifest_name(digest))
        actual = sha256_of(data)
        if actual != digest:
            where = f"manifest data for {self.where(key)}"
            raise IntegrityError(where, expected=digest, actual=actual)
        try:
            if self.bucket.get(key, f"manifest {digest}")[0] == data:
                return  # verified: manifests are small enough to compare every time
        except NotFoundError:
            pass  # absent: write it
        self.bucket.put(key, data, sha256_b64=base64.b64encode(bytes.fromhex(digest.hex)).decode())

    def get_manifest(self, digest: Digest) -> bytes:
        key, what = self._key(manifest_name(digest)), f"manifest {digest}"
        try:
            data = self._reader.read_all(key, what)
        except NotFoundError:  # boto3 says whether the key or the whole bucket is missing
            data, _size = self.bucket.get(key, what)
        actual = sha256_of(data)
        if actual != digest:
            raise IntegrityError(self.where(key), expected=digest, actual=actual)
        return data

    def iter_manifests(self) -> Iterator[Digest]:
        strip = len(self._key(""))
        for entry in self.bucket.list(self._key(MANIFESTS)):
            try:
                yield parse_manifest_name(entry["Key"][strip:])
            except ValueError:
                continue

    def delete_manifest(self, digest: Digest) -> None:
        self.bucket.delete(self._key(manifest_name(digest)))

    # small objects (records) and objects set aside

    def put_object(self, key: str, data: bytes) -> None:
        self.bucket.put(self._key(key), data)

    def get_object(self, key: str) -> bytes:
        return self.bucket.get(self._key(key), f"object {key}")[0]

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        strip = len(self._key(""))
        for entry in self.bucket.list(self._key(prefix)):
            yield ObjectInfo(entry["Key"][strip:], int(entry["Size"]),
                             entry["LastModified"].astimezone(UTC))

    def move_object(self, key: str, new_key: str) -> bool:
        """Copy, then delete the original: S3 has no rename. False when *key* is absent."""
        if self.bucket.size(self._key(key), "move_object") is None:
            return False
        self.bucket.copy(self._key(key), self._key(new_key))
        self.bucket.delete(self._key(key))
        return True

    def delete_object(self, key: str) -> None:
        self.bucket.delete(self._key(key))
