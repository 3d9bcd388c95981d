"""The verdict on a stored object that failed a read (`registry.ops.damage.judge`) and the S3
server's word on bytes read back (`registry.store.s3check`): pure, table-tested."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib

import pytest

from registry.identity.digest import Digest
from registry.ops.damage import judge
from registry.store.base import ReadBack, Vouch
from registry.store.s3check import _Running, part_bounds, stated_values, vouch_of

GOOD = Digest("xxh3-128", "1" * 32)
BAD = Digest("xxh3-128", "2" * 32)


@pytest.mark.parametrize(("digest", "vouch", "verdict"), [
    (GOOD, "stored", "intact"),
    (GOOD, "altered", "intact"),
    (BAD, "stored", "damaged"),
    (BAD, "altered", "transfer"),
    (BAD, "unknown", "unproven"),
])
def test_only_bytes_the_store_vouches_for_are_damaged(digest: Digest, vouch: Vouch,
                                                       verdict: str) -> None:
    assert judge(GOOD, ReadBack(digest, vouch, "evidence")).verdict == verdict


def test_a_read_back_that_fails_proves_nothing() -> None:
    judged = judge(GOOD, None, "connection reset")
    assert judged.verdict == "unproven"
    assert "connection reset" in judged.why


def _crc(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def _computed(response: dict[str, str], data: bytes, first: int, step: int) -> list[str | None]:
    """Each stated value computed over *data* fed in *step*-byte chunks."""
    running = [_Running(s, part_bounds(len(data), first if s.parts > 1 else len(data), s.parts))
               for s in stated_values(response)]
    for offset in range(0, len(data), step):
        for hashes in running:
            hashes.update(offset, data[offset:offset + step])
    return [r.value() for r in running]


@pytest.mark.parametrize("step", [7, 1000, 1 << 20])
def test_whole_and_composite_values_are_computed_as_s3_states_them(step: int) -> None:
    data = os.urandom(2500)
    whole = {"ChecksumCRC32": base64.b64encode(_crc(data)).decode(),
             "ChecksumSHA256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
             "ETag": f'"{hashlib.md5(data).hexdigest()}"'}  # noqa: S324 - S3's ETag is MD5
    assert _computed(whole, data, 0, step) == [s.value for s in stated_values(whole)]
    parts = [data[:1000], data[1000:2000], data[2000:]]
    composite = {
        "ChecksumCRC32": base64.b64encode(_crc(b"".join(_crc(p) for p in parts))).decode()
        + "-3",
        "ETag": hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()  # noqa: S324
        + "-3"}
    assert _computed(composite, data, 1000, step) == [s.value for s in stated_values(composite)]
    assert [s.parts for s in stated_values(composite)] == [3, 3]


def test_the_server_vouches_only_when_a_value_it_states_matches() -> None:
    [crc] = stated_values({"ChecksumCRC32": "u0INDA=="})
    assert vouch_of([(crc, "u0INDA==")])[0] == "stored"
    assert vouch_of([(crc, "AAAAAA==")])[0] == "altered"
    assert vouch_of([(crc, None)])[0] == "unknown"  # parts of sizes that cannot be learnt
    assert vouch_of([])[0] == "unknown"


def test_an_etag_under_sse_kms_is_no_md5_and_says_nothing() -> None:
    etag = '"' + "a" * 32 + '"'
    assert [s.label for s in stated_values({"ETag": etag})] == ["ETag"]
    assert stated_values({"ETag": etag, "ServerSideEncryption": "aws:kms"}) == []
    assert stated_values({"ETag": etag, "SSECustomerAlgorithm": "AES256"}) == []


@pytest.mark.parametrize(("total", "first", "count", "bounds"), [
    (2500, 1000, 3, [0, 1000, 2000, 2500]),
    (3000, 1000, 3, [0, 1000, 2000, 3000]),
    (2000, 1000, 3, None),  # the third part would be empty
    (3001, 1000, 3, None),
    (0, 0, 1, [0, 0]),
])
def test_part_bounds(total: int, first: int, count: int, bounds: list[int] | None) -> None:
    assert part_bounds(total, first, count) == bounds
