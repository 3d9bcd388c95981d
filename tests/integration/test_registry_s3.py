"""publish and fetch over S3 through a proxy that fails, cuts or watches requests: retries on
transient errors, checked and unsigned upload bodies, a cut-off body resumed where it stopped,
and a permanent error in one line (the verbs themselves: test_registry_verbs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.ops.adopt import import_artifact
from registry.ops.fetch import fetch
from tests.integration.engines import engine_spec, make_engine
from tests.integration.s3server import S3Server


def test_transient_s3_errors_are_retried(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Throttling and connection resets on every other request: publish and fetch still
    succeed, verified, because the store retries with backoff. (Two failures in three
    drain botocore's retry quota, a per-client budget, within a publish's ~100 requests:
    by design, not something to hide.)"""
    from tests.integration.faulty_proxy import FaultyProxy

    faults = ("pass", "slowdown", "pass", "reset")
    with FaultyProxy(s3_server.endpoint_url, lambda n, *_: faults[n % 4]) as proxy:
        def flaky() -> Context:  # one client each, as the builder and the deploy node have
            return Context(RegistryConfig(
                home=tmp_path / "home", store_url=f"s3://{s3_bucket}/flaky",
                s3_endpoint_url=proxy.endpoint_url, registry_url=f"sqlite:///{tmp_path / 'r.db'}",
                cache_dir=tmp_path / "cache"))

        builder, node = flaky(), flaky()
        published = import_artifact(builder, make_engine(tmp_path / "engine"), engine_spec())
        fetched = fetch(node, published.digest, tmp_path / "out")
        builder.close()
        node.close()
    assert fetched.manifest.digest == published.manifest.digest
    assert proxy.faults.count("slowdown") >= 3
    assert proxy.faults.count("reset") >= 3


def test_uploads_carry_a_checked_crc32_and_leave_the_body_out_of_the_signature(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every PUT boto3 sends for a publish (single objects and multipart parts) carries a
    CRC32 that S3 checks, signed as a header, and `UNSIGNED-PAYLOAD` for the body, so
    botocore does not sha256 each part again (the blob's own digest is what every fetch
    verifies); what lands is the artifact, byte for byte. (Parts are boto3's here as over
    https; over plain http they are sent from the file, test_s3_sendfile.py.)"""
    from tests.integration.faulty_proxy import FaultyProxy

    monkeypatch.setenv("ENGINECTL_S3_SPLICE", "0")

    engine = make_engine(tmp_path / "engine")
    (engine / "rank1.engine").write_bytes(os.urandom(12 << 20))  # a multipart upload
    with FaultyProxy(s3_server.endpoint_url, lambda *_: "pass") as proxy:
        context = Context(RegistryConfig(
            home=tmp_path / "home", store_url=f"s3://{s3_bucket}/unsigned",
            s3_endpoint_url=proxy.endpoint_url, registry_url=f"sqlite:///{tmp_path / 'r.db'}",
            cache_dir=tmp_path / "cache"))
        context.store.upload_part_size = 5 << 20  # type: ignore[attr-defined]
        published = import_artifact(context, engine, engine_spec())
        fetched = fetch(context, published.digest, tmp_path / "out", verify="strict")
        context.close()
    parts = [h for path, h in proxy.puts if "partNumber=" in path]
    blobs = [h for path, h in proxy.puts if "/blobs/" in path and "partNumber=" not in path]
    assert len(parts) >= 3  # 12 MiB in 5 MiB parts, at least
    assert blobs  # the small files: one PUT each
    for headers in parts + blobs:
        assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
        assert "x-amz-checksum-crc32" in headers
        assert "x-amz-checksum-crc32" in headers["authorization"]  # signed: cannot be swapped
    assert fetched.manifest.digest == published.manifest.digest
    landed = (tmp_path / "out" / "rank1.engine").read_bytes()
    assert landed == (engine / "rank1.engine").read_bytes()


def test_a_body_cut_off_mid_stream_is_resumed_where_it_stopped(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Every first answer to a GET of a blob stops half-way through its body: the fetch asks
    for the rest from the byte where it stopped, not for the whole part again."""
    from tests.integration.faulty_proxy import Fault, FaultyProxy

    store_url = f"s3://{s3_bucket}/cut"
    published = import_artifact(Context(RegistryConfig(
        home=tmp_path / "home", store_url=store_url, s3_endpoint_url=s3_server.endpoint_url,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache0",
    )), make_engine(tmp_path / "engine"), engine_spec())
    cut: set[str] = set()  # each blob's first GET only: the resumed read must get through

    def plan(_n: int, method: str, path: str, wanted: str | None) -> Fault:
        if method != "GET" or not (wanted or "").startswith("bytes=0-") or path in cut:
            return "pass"
        cut.add(path)
        return "cut"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        context = Context(RegistryConfig(
            home=tmp_path / "home", store_url=store_url, s3_endpoint_url=proxy.endpoint_url,
            registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache",
        ))
        fetched = fetch(context, published.digest, tmp_path / "out", verify="strict")
        context.close()
    assert fetched.downloaded_bytes == published.manifest.size
    blobs = len({entry.xxh3 for entry in published.manifest.files})
    assert proxy.faults.count("cut") == blobs
    firsts = [r for r in proxy.ranges if r and r.startswith("bytes=0-")]
    resumed = [r for r in proxy.ranges if r and not r.startswith("bytes=0-")]
    assert len(firsts) == len(resumed) == blobs
    assert all(int(r.removeprefix("bytes=").split("-")[0]) > 0 for r in resumed)
    if hasattr(os, "splice"):  # the first reads were spliced (presigned), the rest obstore's
        assert all(("X-Amz-Signature=" in path) == (wanted in firsts)
                   for path, wanted in proxy.gets if wanted)


def test_a_permanent_s3_error_is_one_line_with_the_request_id(
    s3_server: S3Server, tmp_path: Path, aws_env: None
) -> None:
    from registry.errors import StoreError

    context = Context(RegistryConfig(
        home=tmp_path / "home", store_url="s3://no-such-bucket-here/x",
        s3_endpoint_url=s3_server.endpoint_url,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache",
    ))
    with pytest.raises(StoreError) as caught:
        import_artifact(context, make_engine(tmp_path / "engine"), engine_spec())
    context.close()
    message = str(caught.value)
    assert "\n" not in message
    assert "no-such-bucket-here" in message
    assert "does not exist" in message
    assert "request id" in message
    del aws_env


def test_a_blob_is_written_into_the_cache_file_without_truncating_it(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache hands get_blob an empty temp file; opened with O_TRUNC, ext4 (auto_da_alloc)
    marks it, and its close starts writeback of the whole blob in the fetch's own thread,
    which then waits on the disk before it takes the next blob and pays for the I/O's
    submission (bench/README.md, fetch_s3). The size is set with ftruncate instead."""
    from registry.store.opener import open_store
    from tests.integration.store_objects import make_blob

    store = open_store(f"s3://{s3_bucket}/trunc", s3_endpoint_url=s3_server.endpoint_url)
    blob = make_blob(tmp_path, 3 << 20)
    store.put_blob(blob.digest, blob.path)
    dest = tmp_path / "cache-temp"
    dest.touch()
    opened: list[int] = []
    real_open = os.open

    def recording_open(path: object, flags: int, *args: int, **kwargs: object) -> int:
        if str(path) == str(dest):
            opened.append(flags)
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", recording_open)
    store.get_blob(blob.digest, dest, size=blob.size)
    monkeypatch.undo()
    assert dest.read_bytes() == blob.path.read_bytes()
    assert opened
    assert not any(flags & os.O_TRUNC for flags in opened), opened
