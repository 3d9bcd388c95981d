"""Publish's plain-http path (`registry.store.s3sendfile`): multipart parts sent by the kernel from
the file on presigned PUTs whose CRC32 is a signed header, and every part it does not get
through sent by boto3, through the faulty proxy in front of the real S3 test server."""

from __future__ import annotations

import base64
import os
import zlib
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.identity.digest import digest_file
from registry.identity.layout import blob_name
from registry.ops.adopt import import_artifact
from registry.ops.fetch import fetch
from registry.store.s3sendfile import crc32_of
from tests.integration.engines import engine_spec, make_engine
from tests.integration.faulty_proxy import Fault, FaultyProxy
from tests.integration.s3server import S3Server

pytestmark = pytest.mark.skipif(not hasattr(os, "sendfile"), reason="sendfile(2)")

PART = 5 << 20  # S3's smallest part
BIG = 3 * PART + 12345  # four parts, the last a short one


def _engine(tmp_path: Path) -> tuple[Path, str]:
    engine = make_engine(tmp_path / "engine")
    (engine / "rank1.engine").write_bytes(os.urandom(BIG))
    return engine, blob_name(digest_file(engine / "rank1.engine", with_sha256=False).xxh3)


def _import(tmp_path: Path, s3_bucket: str, endpoint: str, engine: Path, name: str) -> str:
    context = Context(RegistryConfig(
        home=tmp_path / "home", store_url=f"s3://{s3_bucket}/{name}", s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache"))
    context.store.upload_part_size = PART  # type: ignore[attr-defined]
    context.store.upload_threads = 1  # type: ignore[attr-defined] # parts in order
    published = import_artifact(context, engine, engine_spec())
    fetch(context, published.digest, tmp_path / "out", verify="strict")
    context.close()
    return published.digest


def _presigned(path: str) -> bool:
    return "X-Amz-Signature=" in path


def _part_puts(proxy: FaultyProxy, key: str) -> list[tuple[int, bool, dict[str, str]]]:
    """(part number, presigned?, headers) of every part PUT of *key*, in order."""
    found = []
    for path, headers in proxy.puts:
        query = parse_qs(urlsplit(path).query)
        if key in path and "partNumber" in query:
            found.append((int(query["partNumber"][0]), _presigned(path), headers))
    return found


def _crc(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _landed(tmp_path: Path, engine: Path) -> bool:
    return (tmp_path / "out" / "rank1.engine").read_bytes() == \
        (engine / "rank1.engine").read_bytes()


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_parts_over_http_are_sent_from_the_file_with_a_signed_crc32_unless_turned_off(
    each_s3_bucket: str, each_s3_server: S3Server, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, kernel: str,
) -> None:
    """Over http every part is a presigned PUT whose signed `x-amz-checksum-crc32` header is
    the CRC32 of exactly that part's bytes, as they went over the wire (so S3 checks them,
    and a swapped header breaks the signature); what lands is the file, byte for byte.
    ENGINECTL_S3_SPLICE=0 sends every part through boto3 (signed in its Authorization
    header). On moto, and on s3rver, which refuses a wrong signature."""
    monkeypatch.setenv("ENGINECTL_S3_SPLICE", kernel)
    engine, key = _engine(tmp_path)
    data = (engine / "rank1.engine").read_bytes()
    with FaultyProxy(each_s3_server.endpoint_url, lambda *_: "pass") as proxy:
        _import(tmp_path, each_s3_bucket, proxy.endpoint_url, engine, "sendfile")
    parts = _part_puts(proxy, key)
    assert [number for number, _, _ in parts] == [1, 2, 3, 4]
    for number, presigned, headers in parts:
        assert presigned == (kernel == "1")
        chunk = data[(number - 1) * PART: number * PART]
        assert headers["x-amz-checksum-crc32"] == _crc(chunk)
        assert headers["content-length"] == str(len(chunk))
    for path, headers in proxy.puts:  # every part as it went over the wire, hashed there
        if "partNumber=" in path and key in path and _presigned(path):
            assert proxy.put_crc32[path] == headers["x-amz-checksum-crc32"]
    for path, headers in proxy.puts:
        if _presigned(path):
            signed = parse_qs(urlsplit(path).query)["X-Amz-SignedHeaders"][0].split(";")
            assert "x-amz-checksum-crc32" in signed
            assert "authorization" not in headers
    assert _landed(tmp_path, engine)


def test_a_throttled_part_is_sent_by_boto3_and_the_path_stays_on(
    s3_bucket: str, s3_server: S3Server, tmp_path: Path,
) -> None:
    """A 503 SlowDown to the first presigned part: boto3 sends that part (its own PUT), and
    throttling says nothing against the path, so the next part is presigned again."""
    engine, key = _engine(tmp_path)
    throttled: list[str] = []

    def plan(_n: int, method: str, path: str, _range: str | None) -> Fault:
        if method == "PUT" and _presigned(path) and not throttled:
            throttled.append(path)
            return "slowdown"
        return "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        _import(tmp_path, s3_bucket, proxy.endpoint_url, engine, "throttled")
    parts = [(number, presigned) for number, presigned, _ in _part_puts(proxy, key)]
    assert parts == [(1, True), (1, False), (2, True), (3, True), (4, True)]
    assert _landed(tmp_path, engine)


@pytest.mark.parametrize("fault", ["forbidden", "refuse", "reset"])
def test_a_refused_or_reset_part_is_sent_by_boto3(
    s3_bucket: str, s3_server: S3Server, tmp_path: Path, fault: Fault,
) -> None:
    """A server that refuses presigned PUTs (403, after the body or before reading any of
    it) while it takes boto3's: the part goes through boto3 and the path is off for the
    rest. A connection reset: boto3 sends that part, and the path stays on (a reset says
    nothing against it)."""
    engine, key = _engine(tmp_path)

    def plan(_n: int, method: str, path: str, _range: str | None) -> Fault:
        return fault if method == "PUT" and _presigned(path) and "partNumber=1&" in path \
            else "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        _import(tmp_path, s3_bucket, proxy.endpoint_url, engine, fault)
    parts = [(number, presigned) for number, presigned, _ in _part_puts(proxy, key)]
    on = fault == "reset"
    assert parts == [(1, True), (1, False), (2, on), (3, on), (4, on)]
    assert proxy.faults.count(fault) == 1
    assert _landed(tmp_path, engine)


@pytest.mark.parametrize(
    ("start", "end"), [(0, 1), (0, 1 << 20), (1, (1 << 20) + 7), (4097, 3 << 20), (0, 3 << 20)])
def test_crc32_of_a_range_is_what_s3_checks(tmp_path: Path, start: int, end: int) -> None:
    """The CRC32 of a file's range, read in steps, is the CRC32 of those bytes, written as S3
    writes it (base64 of 4 big-endian bytes); a file shorter than the range is an error."""
    data = os.urandom(3 << 20)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert crc32_of(fd, (start, end)) == _crc(data[start:end])
        with pytest.raises(EOFError):
            crc32_of(fd, (start, len(data) + 1))
    finally:
        os.close(fd)


@pytest.mark.parametrize("tamper", ["none", "signature", "crc32 header", "secret"])
def test_s3rver_refuses_a_part_signed_wrong(
    s3rver_server: S3Server, monkeypatch: pytest.MonkeyPatch, tamper: str,
) -> None:
    """What makes s3rver worth running: a presigned part PUT, made as the sendfile path
    makes it, goes in as it is and is refused with 403 SignatureDoesNotMatch once its
    signature is changed, once the signed `x-amz-checksum-crc32` header is swapped for the
    CRC32 of other bytes, or when the URL was signed with a wrong secret. (moto takes all
    three; so does s3rver's own last release, 3.7.1, which checks only SigV2.)"""
    import http.client

    from registry.store.s3bucket import Bucket

    data = os.urandom(PART)
    crc = _crc(data)
    name = s3rver_server.create_bucket()  # never deleted: s3rver has no abort of an upload
    upload = s3rver_server.client.create_multipart_upload(
        Bucket=name, Key="part", ChecksumAlgorithm="CRC32")["UploadId"]
    if tamper == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    bucket = Bucket(name, store_url=f"s3://{name}", endpoint_url=s3rver_server.endpoint_url)
    url = urlsplit(bucket.presign_part("part", upload, 1, crc, 60))
    query = url.query
    if tamper == "signature":
        signature = parse_qs(query)["X-Amz-Signature"][0]
        query = query.replace(signature, signature[::-1])
    header = _crc(data[:-1]) if tamper == "crc32 header" else crc
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        connection.request("PUT", f"{url.path}?{query}", body=data,
                           headers={"x-amz-checksum-crc32": header})
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    if tamper == "none":
        assert answer.status == 200, body
    else:
        assert answer.status == 403, body
        assert b"SignatureDoesNotMatch" in body
