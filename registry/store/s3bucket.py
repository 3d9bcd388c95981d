"""One S3 bucket over boto3, with every failure translated where it enters.

Transient failures (throttling, 5xx, connection resets) are retried by botocore in "standard"
mode; a body cut off mid-read is fetched again here. What is left is permanent: a
`ClientError` becomes `StoreError` naming the operation, the object, the S3 error code and
the request id; a missing key becomes `NotFoundError`; a missing bucket says so by name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

from registry.errors import NotFoundError, RegistryError, StoreError
from registry.identity.layout import s3_url
from registry.store.base import check_stop

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

MISSING: Final = frozenset({"404", "NoSuchKey", "NotFound"})
STREAM_CHUNK: Final = 1 << 20
"""The most a ranged read holds in memory at once: it writes each chunk as it arrives."""


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


class Bucket:
    """Raw object operations on one bucket; *store_url* is what messages call the store."""

    def __init__(
        self,
        name: str,
        *,
        store_url: str,
        endpoint_url: str | None = None,
        pool_connections: int = 32,
        stream_retries: int = 5,
    ) -> None:
        self.name = name
        self.store_url = store_url
        self.endpoint_url = endpoint_url
        self.stream_retries = max(1, stream_retries)
        # Bodies are not hashed into the signature (botocore would sha256 every part over
        # http: ~0.6 CPU-s per GiB, a sixth of an import's CPU). Each PUT carries a CRC32,
        # signed as a header, that S3 checks against the bytes, and each blob is named by
        # its digests, which every fetch checks (xxh3-128; sha256 too with --verify
        # strict). Over https botocore already sends a checksum instead of signing the
        # body; over plain http no GET body is signed either, so such an endpoint belongs
        # on a trusted network whichever way uploads are signed.
        # S3-compatible servers rarely resolve virtual-hosted bucket names: path style there
        # SigV4 said outright over plain http: that is the only place parts are sent from
        # presigned URLs (registry.store.s3sendfile), and botocore presigns with SigV2 unless told
        self._config = config = Config(
            signature_version="s3v4" if (endpoint_url or "").startswith("http://") else None,
            retries={"mode": "standard", "max_attempts": 8},
            max_pool_connections=pool_connections,
            connect_timeout=10,
            read_timeout=60,
            tcp_keepalive=True,
            s3={"payload_signing_enabled": False, "addressing_style": "path"} if endpoint_url
            else {"payload_signing_enabled": False},
        )
        # one per bucket: sessions are not thread-safe; the blob reader takes its
        # credentials from it too (registry.store.s3get)
        self.session = boto3.session.Session()
        self.client: S3Client = self.session.client("s3", endpoint_url=endpoint_url,
                                                    config=config)
        self._seen = False
        self._making = threading.Lock()

    def fresh_client(self) -> S3Client:
        """A client of its own, with new connections (the caller closes it): a read that
        must not share anything with the ones that failed (`registry.store.s3check`)."""
        with self._making:  # a boto3 session is not safe to share while making clients
            return self.session.client("s3", endpoint_url=self.endpoint_url,
                                       config=self._config)

    def presign_part(self, key: str, upload_id: str, number: int, crc: str,
                     seconds: int) -> str:
        """A URL that PUTs part *number* of the multipart upload *upload_id* of *key* for
        *seconds*, with its CRC32 *crc* a signed header (`x-amz-checksum-crc32`)."""
        return self.client.generate_presigned_url(
            "upload_part", ExpiresIn=seconds,
            Params={"Bucket": self.name, "Key": key, "UploadId": upload_id,
                    "PartNumber": number, "ChecksumCRC32": crc})

    def region(self) -> str | None:
        """The bucket's own region, from a HEAD bucket (AWS answers it from any region);
        the client's region when the server does not say."""
        try:
            answer = self.client.head_bucket(Bucket=self.name)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "head_bucket", None) from exc
        headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return str(answer.get("BucketRegion") or headers.get("x-amz-bucket-region")
                   or self.client.meta.region_name or "") or None

    def where(self, key: str) -> str:
        return s3_url(self.name, key)

    def error(
        self, exc: Exception, operation: str, key: str | None, what: str | None = None
    ) -> RegistryError:
        """The enginectl error for *exc*; a missing key is NotFoundError when *what* is given."""
        where = self.where(key) if key else f"s3://{self.name}"
        if not isinstance(exc, ClientError):
            return StoreError(
                f"{operation} {where} failed: {exc}",
                url=self.store_url,
                key=key,
                operation=operation,
            )
        code = error_code(exc)
        if code in MISSING and what is not None and key is not None:
            return NotFoundError(what, url=self.store_url, key=key)
        if code == "NoSuchBucket":
            at = f" at {self.endpoint_url}" if self.endpoint_url else ""
            detail = (
                f"bucket {self.name!r} does not exist{at}; "
                "create it or fix the store URL (ENGINECTL_STORE_URL)"
            )
        else:
            detail = str(exc.response.get("Error", {}).get("Message") or code)
        return StoreError(
            f"{operation} {where} failed: {detail}",
            url=self.store_url,
            key=key,
            operation=operation,
            code=code,
            request_id=exc.response.get("ResponseMetadata", {}).get("RequestId"),
        )

    def check(self) -> None:
        """A HEAD 404 does not say whether the key or the bucket is missing; ask once.

        A one-key LIST needs the same permission as HEAD bucket, and its error has a body
        (error code, request id) where a HEAD has none."""
        if self._seen:
            return
        try:
            self.client.list_objects_v2(Bucket=self.name, MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "list_objects_v2", None) from exc
        self._seen = True

    def exists(self, key: str, operation: str) -> bool:
        return self.size(key, operation) is not None

    def size(self, key: str, operation: str) -> int | None:
        """The object's size from a HEAD; None when there is no such object."""
        try:
            response = self.client.head_object(Bucket=self.name, Key=key)
        except ClientError as exc:
            if error_code(exc) not in MISSING:
                raise self.error(exc, operation, key) from exc
            self.check()
            return None
        except BotoCoreError as exc:
            raise self.error(exc, operation, key) from exc
        self._seen = True
        return int(response.get("ContentLength") or 0)

    def get(
        self, key: str, what: str, byte_range: tuple[int, int] | None = None
    ) -> tuple[bytes, int]:
        """The object's bytes (or those in [start, end)) and the object's total size."""
        parts: list[bytes] = []
        total = self.read_into(key, what, lambda _offset, chunk: parts.append(chunk), byte_range)
        return b"".join(parts), total

    def read_into(
        self,
        key: str,
        what: str,
        write: Callable[[int, bytes], None],
        byte_range: tuple[int, int] | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Stream the object's bytes (or those in [start, end)) to `write(offset, chunk)` in
        chunks of at most STREAM_CHUNK, and return the object's total size. A body cut off
        mid-read is asked for again from the byte where it stopped. Once *stop* is set,
        StoppedError ends the read at its next chunk (the connection is dropped)."""
        start, end = byte_range if byte_range is not None else (0, None)
        done, total, failure = 0, None, None
        for _attempt in range(self.stream_retries):
            check_stop(stop)
            if total is not None and start + done >= (end if end is not None else total):
                return total  # cut off after the last byte: nothing is left to ask for
            ask = None if byte_range is None and not done else (
                f"bytes={start + done}-{'' if end is None else end - 1}")
            try:
                response = (
                    self.client.get_object(Bucket=self.name, Key=key, Range=ask)
                    if ask
                    else self.client.get_object(Bucket=self.name, Key=key)
                )
            except ClientError as exc:
                if error_code(exc) == "InvalidRange" and start + done == 0:
                    return 0  # an empty object has no byte 0
                raise self.error(exc, "get_object", key, what) from exc
            except BotoCoreError as exc:
                raise self.error(exc, "get_object", key, what) from exc
            total = self._total(key, response, ranged=start + done > 0)
            body = response["Body"]
            try:
                while chunk := body.read(STREAM_CHUNK):
                    check_stop(stop)
                    write(start + done, chunk)
                    done += len(chunk)
            except S3_RETRYABLE_DOWNLOAD_ERRORS as exc:
                failure = exc
                continue
            finally:
                body.close()
            self._seen = True
            return total
        raise StoreError(
            f"get_object {self.where(key)} failed: the body was cut off "
            f"{self.stream_retries} times, last: {failure}",
            url=self.store_url,
            key=key,
            operation="get_object",
        ) from failure

    def _total(self, key: str, response: Mapping[str, Any], *, ranged: bool) -> int:
        """The object's size from a GET's answer; a server that ignored a Range from a byte
        other than 0 would misplace every byte, so that is an error."""
        content_range = response.get("ContentRange")
        if content_range:
            return int(str(content_range).rsplit("/", 1)[1])
        if ranged:
            raise StoreError(
                f"get_object {self.where(key)}: the server ignored the Range header",
                url=self.store_url,
                key=key,
                operation="get_object",
            )
        return int(response.get("ContentLength") or 0)

    def put(self, key: str, data: bytes, *, sha256_b64: str | None = None) -> None:
        """Put a small object; S3 rejects it unless its sha256 is *sha256_b64* (computed
        here when not given)."""
        if sha256_b64 is None:
            import base64
            import hashlib

            sha256_b64 = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            self.client.put_object(
                Bucket=self.name,
                Key=key,
                Body=data,
                ContentType="application/json",
                ChecksumSHA256=sha256_b64,
            )
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "put_object", key) from exc

    def copy(self, key: str, new_key: str) -> None:
        """Server-side copy (multipart for large objects)."""
        try:
            self.client.copy({"Bucket": self.name, "Key": key}, self.name, new_key)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "copy_object", key) from exc

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.name, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "delete_object", key) from exc

    def list(self, prefix: str, *, start_after: str = "") -> Iterator[dict[str, Any]]:
        """Listing entries (Key, Size, LastModified, …) under *prefix*, in key order."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix, StartAfter=start_after
        )
        try:
            for page in pages:
                for entry in page.get("Contents", []):
                    yield dict(entry)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "list_objects_v2", prefix) from exc
        self._seen = True
