"""Reading an S3 object back whole to judge it: whether the bytes that fail their digest are
the ones the server holds, or were changed on the way (`Store.read_back`).

A network path that corrupts what it carries gives the same wrong bytes to every read of one
client, so reads alone can never tell a damaged object from a corrupted transfer. The server
can: when an object is written it computes a checksum of the bytes it received and keeps it
(S3's flexible checksums: every enginectl PUT carries a CRC32, manifests their SHA-256; and,
on most servers, an ETag that is the MD5 of the bytes or of their parts' MD5s). This read goes
by boto3 on a client of its own (new connections, none of the fast path's obstore or splice
code), asks for the checksum (`ChecksumMode`), hashes the body as it streams with the
server's algorithms, and compares:

- a value the server states equals the one computed: the bytes read are the bytes stored
  ("stored");
- values were stated and none matches: they changed after the server sent them ("altered");
- nothing comparable (no checksum, an ETag that is not an MD5 under SSE-KMS or SSE-C, parts
  of sizes that cannot be learnt): "unknown", which never condemns an object.

A multipart object's checksum and ETag are of its parts' (`<value>-<parts>`): the part size
comes from a HEAD of part 1, every part but the last that size, as every uploader writes
them; parts cut otherwise give values that do not match, which never condemns either.
Boto3 is loaded by the time this runs (the store's `Bucket` is).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

from registry.errors import StoreError
from registry.identity.digest import Algorithm, Digest
from registry.store.base import ReadBack, Vouch, hash_for

if TYPE_CHECKING:
    from registry.store.s3bucket import Bucket

CHUNK: Final = 1 << 20
_ETAG: Final = re.compile(r"^([0-9a-f]{32})(?:-(\d+))?$")
_PARTS: Final = re.compile(r"^(.+)-(\d+)$")
_NOT_MD5: Final = frozenset({"aws:kms", "aws:kms:dsse"})
"""Server-side encryptions under which an ETag is not the MD5 of the bytes."""


class _Crc32:
    """zlib's CRC32 as a hash object; `digest()` is its 4 big-endian bytes, as S3 encodes it."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


def _crc32() -> Any:
    return _Crc32()


CHECKSUMS: Final[dict[str, Callable[[], Any]]] = {
    "ChecksumCRC32": _crc32, "ChecksumSHA256": hashlib.sha256, "ChecksumSHA1": hashlib.sha1}
"""The flexible checksums this read can compute (CRC32C and CRC64NVME need libraries that
are not installed: those are left out, as if not stated)."""


@dataclass(frozen=True, slots=True)
class Stated:
    """One value the server states of an object: *label* (`CRC32`, `ETag`), the value as
    sent, the hash that makes it and how to encode one, and its part count (1: whole)."""

    label: str
    value: str
    new: Callable[[], Any]
    encode: Callable[[bytes], str]
    parts: int


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def stated_values(response: dict[str, Any]) -> list[Stated]:
    """What a GET's answer says the stored bytes hash to. Pure."""
    found: list[Stated] = []
    for name, new in CHECKSUMS.items():
        value = str(response.get(name) or "")
        if value:
            match = _PARTS.match(value)
            found.append(Stated(name.removeprefix("Checksum"), value, new, _b64,
                                int(match.group(2)) if match else 1))
    etag = str(response.get("ETag") or "").strip('"')
    encrypted = response.get("ServerSideEncryption") in _NOT_MD5 \
        or response.get("SSECustomerAlgorithm")
    if (match := _ETAG.match(etag)) and not encrypted:
        found.append(Stated("ETag", etag, hashlib.md5, bytes.hex,
                            int(match.group(2)) if match.group(2) else 1))
    return found


def part_bounds(total: int, first: int, count: int) -> list[int] | None:
    """The offsets where *count* parts of *total* bytes begin, each *first* bytes but the
    last, then *total*; None when no such cut exists. Pure."""
    if count == 1:
        return [0, total]
    if count < 1 or first < 1 or not first * (count - 1) < total <= first * count:
        return None
    return [*range(0, first * count, first), total]


@dataclass
class _Running:
    """The hashes of one stated value over the body as it streams, part by part."""

    stated: Stated
    bounds: list[int] | None
    done: list[bytes] = field(default_factory=list)
    current: Any = None

    def __post_init__(self) -> None:
        self.current = self.stated.new()

    def update(self, offset: int, data: bytes) -> None:
        """Hash *data*, the body's bytes from *offset* on, into the parts they belong to."""
        if self.bounds is None:
            return
        while data:
            part = len(self.done)
            end = self.bounds[part + 1]
            take = min(len(data), end - offset)
            if take <= 0:
                return  # past the object's end: the caller finds the size wrong
            self.current.update(data[:take])
            offset, data = offset + take, data[take:]
            if offset == end and part + 2 < len(self.bounds):  # a whole part, not the last
                self.done.append(self.current.digest())
                self.current = self.stated.new()

    def value(self) -> str | None:
        """The value computed, encoded as the server states it; None when unknowable."""
        if self.bounds is None:
            return None
        parts = [*self.done, self.current.digest()]
        if self.stated.parts == 1:
            return self.stated.encode(parts[0])
        whole = self.stated.new()
        for raw in parts:
            whole.update(raw)
        return f"{self.stated.encode(whole.digest())}-{len(parts)}"


def vouch_of(compared: Iterable[tuple[Stated, str | None]]) -> tuple[Vouch, str]:
    """The store's word on bytes read back, from each stated value beside the one computed
    (None: not computable), with what was compared. Pure: the one place that decides it."""
    compared = list(compared)
    for stated, computed in compared:
        if computed == stated.value:
            return "stored", f"they match the server's {stated.label} {stated.value}"
    differing = [(stated, computed) for stated, computed in compared if computed is not None]
    if differing:
        stated, computed = differing[0]
        return "altered", (f"the server's {stated.label} of the object is {stated.value}, "
                           f"the bytes that arrived give {computed}")
    return "unknown", ("the server states no checksum of it that can be compared (no CRC32, "
                       "SHA-256 or MD5 ETag)")


def read_back(bucket: Bucket, key: str, algorithm: Algorithm) -> ReadBack:
    """Read *key* whole on a client of its own, hashing it with *algorithm*, and compare
    it with what the server states (`vouch_of`). NotFoundError when absent, StoreError when
    the read fails."""
    client = bucket.fresh_client()
    what = f"object {key}"
    try:
        response: dict[str, Any] = dict(client.get_object(Bucket=bucket.name, Key=key,
                                                          ChecksumMode="ENABLED"))
        total = int(response.get("ContentLength") or 0)
        stated = stated_values(response)
        first = 0
        if any(s.parts > 1 for s in stated):
            head = client.head_object(Bucket=bucket.name, Key=key, PartNumber=1)
            first = int(head.get("ContentLength") or 0)
        running = [_Running(s, part_bounds(total, first if s.parts > 1 else total, s.parts))
                   for s in stated]
        digest = hash_for(algorithm)
        offset, body = 0, response["Body"]
        try:
            while chunk := body.read(CHUNK):
                digest.update(chunk)
                for hashes in running:
                    hashes.update(offset, chunk)
                offset += len(chunk)
        except FlexibleChecksumError:
            pass  # botocore's own CRC check of the body at its end: the same as ours below
        finally:
            body.close()
    except (ClientError, BotoCoreError) as exc:
        raise bucket.error(exc, "read_back", key, what) from exc
    except S3_RETRYABLE_DOWNLOAD_ERRORS as exc:
        raise StoreError(f"read_back {bucket.where(key)} failed: {exc}", url=bucket.store_url,
                         key=key, operation="read_back") from exc
    finally:
        client.close()
    if offset != total:
        raise StoreError(f"read_back {bucket.where(key)}: {offset} bytes of {total} arrived",
                         url=bucket.store_url, key=key, operation="read_back")
    vouch, evidence = vouch_of((r.stated, r.value()) for r in running)
    return ReadBack(Digest(algorithm, digest.hexdigest()), vouch, evidence)
