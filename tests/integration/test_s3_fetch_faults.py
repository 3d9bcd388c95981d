"""S3 faults on the fetch path never condemn a good blob (issue 21, item 7).

A transport or protocol fault (here: an answer whose Content-Range total is not the object's
size) is asked again and never marks stored data bad; only bytes that fail their digest on
a read back whole are set aside (the server's checksum vouching for them). Through the
faulty proxy in front of the real S3 test server, with the splice path on and off (its
answers are read by different code).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import IntegrityError
from registry.identity.layout import blob_name
from registry.ops.adopt import import_artifact
from registry.ops.damage import iter_damaged
from registry.ops.fetch import fetch
from tests.integration.engines import engine_spec, make_engine
from tests.integration.faulty_proxy import Fault, FaultyProxy
from tests.integration.s3server import S3Server

BIG = (16 << 20) + 4321  # two ranged GETs of 16 MiB parts


def _context(tmp_path: Path, store_url: str, endpoint: str, cache: str) -> Context:
    context = Context(RegistryConfig(
        home=tmp_path / "home", store_url=store_url, s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / cache))
    context.store.download_part_size = 16 << 20  # type: ignore[attr-defined]
    return context


def _publish(tmp_path: Path, s3_server: S3Server, store_url: str) -> tuple[Path, str, str]:
    """An engine with one big blob; (its folder, the artifact's digest, the big blob's key)."""
    engine = make_engine(tmp_path / "engine")
    (engine / "rank1.engine").write_bytes(os.urandom(BIG))
    context = _context(tmp_path, store_url, s3_server.endpoint_url, "cache0")
    published = import_artifact(context, engine, engine_spec())
    context.close()
    big = next(f for f in published.manifest.files if f.path == "rank1.engine")
    return engine, published.digest, blob_name(big.xxh3)


@pytest.mark.parametrize("splice", ["1", "0"])
def test_one_answer_with_a_wrong_content_range_total_is_asked_again(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    splice: str,
) -> None:
    """The first ranged GET of the big blob says the object is a byte longer than it is:
    that answer is dropped and asked again; the fetch lands whole and verified, and nothing
    is set aside (it used to be, and the fetch exited 4)."""
    monkeypatch.setenv("ENGINECTL_S3_SPLICE", splice)
    store_url = f"s3://{s3_bucket}/total-once"
    engine, digest, key = _publish(tmp_path, s3_server, store_url)
    name = key.rsplit("/", 1)[-1]  # the blob's name, in every GET's path
    faulted: list[str] = []

    def plan(_n: int, method: str, path: str, wanted: str | None) -> Fault:
        if method == "GET" and wanted and name in path and not faulted:
            faulted.append(path)
            return "total"
        return "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        context = _context(tmp_path, store_url, proxy.endpoint_url, "cache")
        fetch(context, digest, tmp_path / "out", verify="strict")
        assert list(iter_damaged(context.store)) == []
        context.close()
    assert proxy.faults.count("total") == 1
    assert (tmp_path / "out" / "rank1.engine").read_bytes() == \
        (engine / "rank1.engine").read_bytes()


@pytest.mark.parametrize("splice", ["1", "0"])
def test_a_server_that_always_answers_a_wrong_total_fails_the_fetch_but_condemns_nothing(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    splice: str,
) -> None:
    """Every GET of the big blob says the wrong size (a broken proxy on the way): the fetch
    fails with an integrity error that says the blob stays in the store, the blob stays
    where it is, and once the proxy is gone the same fetch succeeds."""
    monkeypatch.setenv("ENGINECTL_S3_SPLICE", splice)
    store_url = f"s3://{s3_bucket}/total-always"
    engine, digest, key = _publish(tmp_path, s3_server, store_url)
    name = key.rsplit("/", 1)[-1]  # the blob's name, in every GET's path

    def plan(_n: int, method: str, path: str, wanted: str | None) -> Fault:
        return "total" if method == "GET" and wanted and name in path else "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        context = _context(tmp_path, store_url, proxy.endpoint_url, "cache")
        with pytest.raises(IntegrityError) as failed:
            fetch(context, digest, tmp_path / "out")
        context.close()
    assert "stays in the store" in str(failed.value)
    assert not (tmp_path / "out").exists()
    direct = _context(tmp_path, store_url, s3_server.endpoint_url, "cache")
    assert list(iter_damaged(direct.store)) == []
    fetch(direct, digest, tmp_path / "out")
    direct.close()
    assert (tmp_path / "out" / "rank1.engine").read_bytes() == \
        (engine / "rank1.engine").read_bytes()


@pytest.mark.parametrize("splice", ["1", "0"])
def test_a_blob_truncated_in_the_store_is_still_set_aside(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    splice: str,
) -> None:
    """Real damage is still found: a blob cut short in the bucket hashes wrong on two fresh
    whole reads and is set aside, as before."""
    monkeypatch.setenv("ENGINECTL_S3_SPLICE", splice)
    store_url = f"s3://{s3_bucket}/truncated"
    _engine, digest, key = _publish(tmp_path, s3_server, store_url)
    data = s3_server.client.get_object(Bucket=s3_bucket, Key=f"truncated/{key}")["Body"].read()
    s3_server.client.put_object(Bucket=s3_bucket, Key=f"truncated/{key}", Body=data[:-100])
    context = _context(tmp_path, store_url, s3_server.endpoint_url, "cache")
    with pytest.raises(IntegrityError) as failed:
        fetch(context, digest, tmp_path / "out")
    assert "damaged/" in str(failed.value)
    assert [d.key.original for d in iter_damaged(context.store)] == [key]
    context.close()


@pytest.mark.parametrize("splice", ["1", "0"])
def test_one_answer_that_ignores_the_range_is_asked_again(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    splice: str,
) -> None:
    """The second part's first GET is answered with the whole object (a 200 that ignored
    the Range): bytes that would land at the wrong offsets are not read, the part is asked
    for again, and the fetch lands whole; nothing is set aside."""
    monkeypatch.setenv("ENGINECTL_S3_SPLICE", splice)
    store_url = f"s3://{s3_bucket}/whole-once"
    engine, digest, key = _publish(tmp_path, s3_server, store_url)
    name = key.rsplit("/", 1)[-1]
    faulted: list[str] = []

    def plan(_n: int, method: str, path: str, wanted: str | None) -> Fault:
        if method == "GET" and wanted and not wanted.startswith("bytes=0-") \
                and name in path and not faulted:
            faulted.append(path)
            return "whole"
        return "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        context = _context(tmp_path, store_url, proxy.endpoint_url, "cache")
        fetch(context, digest, tmp_path / "out", verify="strict")
        assert list(iter_damaged(context.store)) == []
        context.close()
    assert proxy.faults.count("whole") == 1
    assert (tmp_path / "out" / "rank1.engine").read_bytes() == \
        (engine / "rank1.engine").read_bytes()
