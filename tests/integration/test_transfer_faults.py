"""A fault on the wire never condemns a good blob: only the store's own word sets one aside.

A network path that flips a byte in every GET answers the same wrong bytes every time, so two
reads of the same client agree and prove nothing. A blob or manifest goes under `damaged/`
only when the store vouches that the bytes that fail their digest are the ones it holds (S3:
the checksum it stored when the object was written, CRC32 or SHA-256, or an MD5 ETag; the file
store: the file read again). Through the faulty proxy in front of moto (flexible checksums)
and s3rver (ETags only), with the real CLI; and real damage in the bucket, one part of a
multipart object included, is still set aside.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.identity.layout import blob_name
from registry.ops.adopt import import_artifact
from registry.ops.damage import iter_damaged
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import stderr_of
from tests.integration.engines import engine_spec, make_engine
from tests.integration.faulty_proxy import Fault, FaultyProxy
from tests.integration.s3server import S3Server

PART = 5 << 20  # S3's smallest part but the last


def _context(tmp_path: Path, store_url: str, endpoint: str) -> Context:
    return Context(RegistryConfig(
        home=tmp_path / "home", store_url=store_url, s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache"))


def _fetch(tmp_path: Path, store_url: str, endpoint: str, digest: str, *, out: str,
           code: int) -> str:
    """`enginectl fetch DIGEST -o OUT` with a cache of its own; its stderr."""
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_STORE_URL": store_url, "ENGINECTL_S3_ENDPOINT_URL": endpoint,
           "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'r.db'}",
           "ENGINECTL_CACHE_DIR": str(tmp_path / f"cache-{out}")}
    done: subprocess.CompletedProcess[str] = run_cli(
        [ENGINECTL, "fetch", digest, "-o", str(tmp_path / out)], env=env, timeout=120)
    assert done.returncode == code, (done.stdout, done.stderr)
    return stderr_of(done)


def _only(part: str) -> object:
    """A proxy plan that flips a byte in every GET whose path holds *part*."""
    def plan(_n: int, method: str, path: str, _wanted: str | None) -> Fault:
        return "flip" if method == "GET" and part in path else "pass"
    return plan


@pytest.mark.parametrize("gets", ["every GET", "blob GETs"])
def test_a_path_that_flips_a_byte_in_every_get_condemns_nothing(
    each_s3_server: S3Server, each_s3_bucket: str, tmp_path: Path, gets: str,
) -> None:
    """The issue's reproduction: a fetch through such a path exits 4 naming a transfer
    error, as often as it is run (it used to set the objects aside, after which every
    node's fetch said "not found"); nothing is under `damaged/`, and the same fetch on a
    clean path lands the artifact whole."""
    store_url = f"s3://{each_s3_bucket}/flip"
    source = make_engine(tmp_path / "engine")
    context = _context(tmp_path, store_url, each_s3_server.endpoint_url)
    digest = import_artifact(context, source, engine_spec()).digest
    plan = _only("/" if gets == "every GET" else "/blobs/")
    with FaultyProxy(each_s3_server.endpoint_url, plan) as proxy:  # type: ignore[arg-type]
        for attempt in ("out1", "out2"):
            said = _fetch(tmp_path, store_url, proxy.endpoint_url, digest, out=attempt, code=4)
            assert "transfer error" in said, said
            assert "stays in the store" in said, said
            assert "damaged/" not in said, said
            assert "not found" not in said, said
            assert not (tmp_path / attempt).exists()
    assert "flip" in proxy.faults
    assert list(iter_damaged(context.store)) == []
    _fetch(tmp_path, store_url, each_s3_server.endpoint_url, digest, out="out", code=0)
    for name in ("rank0.engine", "rank1.engine", "config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes()
    context.close()


def test_a_byte_flipped_in_the_bucket_is_still_set_aside(
    each_s3_server: S3Server, each_s3_bucket: str, tmp_path: Path,
) -> None:
    """Real damage, written behind the store's back (the server's checksum or ETag is of the
    bad bytes it now holds): the fetch sets the blob aside and says so, as before."""
    store_url = f"s3://{each_s3_bucket}/rot"
    context = _context(tmp_path, store_url, each_s3_server.endpoint_url)
    published = import_artifact(context, make_engine(tmp_path / "engine"), engine_spec())
    rank1 = next(f for f in published.manifest.files if f.path == "rank1.engine")
    key = f"rot/{blob_name(rank1.xxh3)}"
    client = each_s3_server.client
    data = bytearray(client.get_object(Bucket=each_s3_bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket=each_s3_bucket, Key=key, Body=bytes(data))
    said = _fetch(tmp_path, store_url, each_s3_server.endpoint_url, published.digest,
                  out="out", code=4)
    assert "rank1.engine" in said, said
    assert "damaged/" in said, said
    assert [d.key.original for d in iter_damaged(context.store)] == [blob_name(rank1.xxh3)]
    context.close()


def test_a_multipart_blob_is_judged_by_its_composite_checksum(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path,
) -> None:
    """A blob stored in parts carries a checksum of its parts' checksums (and an ETag of
    their MD5s): a flipped byte on the way is told from a part stored wrong. Through the
    proxy it stays; once a part in the bucket holds a wrong byte, it is set aside."""
    store_url = f"s3://{s3_bucket}/parts"
    source = make_engine(tmp_path / "engine")
    (source / "rank1.engine").write_bytes(os.urandom(PART + 4321))
    context = _context(tmp_path, store_url, s3_server.endpoint_url)
    context.store.upload_part_size = PART  # type: ignore[attr-defined]
    published = import_artifact(context, source, engine_spec())
    rank1 = next(f for f in published.manifest.files if f.path == "rank1.engine")
    key = f"parts/{blob_name(rank1.xxh3)}"
    assert str(s3_server.client.head_object(Bucket=s3_bucket, Key=key)["ETag"]).endswith('-2"')
    flip_rank1 = _only(key.rsplit("/", 1)[-1])
    with FaultyProxy(s3_server.endpoint_url, flip_rank1) as proxy:  # type: ignore[arg-type]
        said = _fetch(tmp_path, store_url, proxy.endpoint_url, published.digest, out="out1",
                      code=4)
    assert "transfer error" in said, said
    assert "rank1.engine" in said, said
    assert "CRC32" in said, said  # the parts' checksums were compared
    assert list(iter_damaged(context.store)) == []

    data = bytearray((source / "rank1.engine").read_bytes())
    data[PART + 10] ^= 0x01  # in the second part
    client = s3_server.client
    upload = client.create_multipart_upload(Bucket=s3_bucket, Key=key,
                                            ChecksumAlgorithm="CRC32")["UploadId"]
    parts = []
    for number, (start, end) in enumerate(((0, PART), (PART, len(data))), start=1):
        sent = client.upload_part(Bucket=s3_bucket, Key=key, UploadId=upload,
                                  PartNumber=number, Body=bytes(data[start:end]),
                                  ChecksumAlgorithm="CRC32")
        parts.append({"PartNumber": number, "ETag": sent["ETag"],
                      "ChecksumCRC32": sent["ChecksumCRC32"]})
    client.complete_multipart_upload(Bucket=s3_bucket, Key=key, UploadId=upload,
                                     MultipartUpload={"Parts": parts})  # type: ignore[typeddict-item]
    said = _fetch(tmp_path, store_url, s3_server.endpoint_url, published.digest, out="out2",
                  code=4)
    assert "damaged/" in said, said
    assert [d.key.original for d in iter_damaged(context.store)] == [blob_name(rank1.xxh3)]
    context.close()
