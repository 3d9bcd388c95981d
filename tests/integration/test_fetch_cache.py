"""A refetch by full digest trusts the cache's verified copy of the manifest: it needs no store
(the S3 server can be down, boto3 is never imported), while an alias is still resolved by
the registry every time, and a copy whose bytes no longer hash to its name is not used.
A cold fetch whose S3 keys are in the environment reads manifests and blobs through obstore
without importing boto3; with an AWS config file it goes through boto3's chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import StoreError
from registry.identity.digest import Digest
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.fetch import fetch
from registry.sql import alias_records
from tests.integration.s3server import S3Server, start_s3_server

FETCH_IN_A_FRESH_INTERPRETER = (
    "import json, sys\nfrom pathlib import Path\nfrom registry.context import Context\n"
    "from registry.ops.fetch import fetch\n"
    "done = fetch(Context(), sys.argv[1], Path(sys.argv[2]))\n"
    "heavy = {'boto3', 'botocore', 's3transfer', 'sqlalchemy', 'alembic'}\n"
    "print(json.dumps({'digest': str(done.manifest.digest), 'downloaded': "
    "done.downloaded_bytes, 'modules': sorted({m.split('.')[0] for m in sys.modules} & heavy)}))\n"
)


@pytest.fixture
def own_s3_server(tmp_path: Path) -> Iterator[S3Server]:
    """An S3 server of this test's own, which the test stops."""
    server = start_s3_server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _config(tmp_path: Path, store_url: str, endpoint: str | None) -> RegistryConfig:
    return RegistryConfig(home=tmp_path / "home", store_url=store_url, s3_endpoint_url=endpoint,
                          registry_url=f"sqlite:///{tmp_path / 'registry.db'}",
                          cache_dir=tmp_path / "cache")


def _publish(ctx: Context, tmp_path: Path, name: str, content: bytes) -> str:
    source = tmp_path / f"src-{name}"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"name": name}))
    (source / "rank0.engine").write_bytes(content)
    spec = ImportSpec(kind="trtllm-engine", model="m", gpu="h100", status="ready")
    return import_artifact(ctx, source, spec).digest


def _fetch_fresh(config: RegistryConfig, ref: str, dest: Path,
                 **extra_env: str) -> dict[str, object]:
    env = {**os.environ, **extra_env, "ENGINECTL_HOME": str(config.home),
           "ENGINECTL_STORE_URL": config.store_url,
           "ENGINECTL_REGISTRY_URL": config.registry_url,
           "ENGINECTL_CACHE_DIR": str(config.cache_dir)}
    env.pop("ENGINECTL_S3_ENDPOINT_URL", None)
    if config.s3_endpoint_url is not None:
        env["ENGINECTL_S3_ENDPOINT_URL"] = config.s3_endpoint_url
    done = subprocess.run([sys.executable, "-c", FETCH_IN_A_FRESH_INTERPRETER, ref, str(dest)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_refetch_by_digest_works_with_the_s3_server_stopped(
        tmp_path: Path, own_s3_server: S3Server) -> None:
    bucket = own_s3_server.create_bucket()
    config = _config(tmp_path, f"s3://{bucket}/p", own_s3_server.endpoint_url)
    ctx = Context(config)
    first = _publish(ctx, tmp_path, "first", b"first engine")
    second = _publish(ctx, tmp_path, "second", b"second engine")
    with ctx.registry.session() as session:
        alias_records.set_alias(session, "m/prod", first)
    ctx.close()

    # the first fetches go to the server and fill the cache: keys in the environment,
    # no AWS config file: obstore alone, no boto3 (the registry's ORM is not needed either)
    for digest in (first, second):
        cold = _fetch_fresh(config, digest, tmp_path / f"cold-{digest[7:15]}")
        assert cold["digest"] == digest
        assert cold["downloaded"] > 0
        assert cold["modules"] == []

    own_s3_server.stop()

    # by full digest: the cached manifest and blobs, no store, no boto3, no ORM
    again = _fetch_fresh(config, first, tmp_path / "again")
    assert again == {"digest": first, "downloaded": 0, "modules": []}
    assert (tmp_path / "again" / "rank0.engine").read_bytes() == b"first engine"

    # by alias: the registry is asked each time, so a moved alias is followed at once
    assert _fetch_fresh(config, "m/prod", tmp_path / "alias-1")["digest"] == first
    with Context(config) as ctx, ctx.registry.session() as session:
        alias_records.set_alias(session, "m/prod", second)
    moved = _fetch_fresh(config, "m/prod", tmp_path / "alias-2")
    assert moved["digest"] == second
    assert (tmp_path / "alias-2" / "rank0.engine").read_bytes() == b"second engine"


def test_a_cold_fetch_goes_through_boto3s_chain_when_an_aws_config_file_exists(
        tmp_path: Path, own_s3_server: S3Server) -> None:
    """An AWS config file may set the region, the endpoint or the addressing style, which
    only boto3 reads: then the credentials, endpoint and region are boto3's."""
    bucket = own_s3_server.create_bucket()
    config = _config(tmp_path, f"s3://{bucket}/p", own_s3_server.endpoint_url)
    with Context(config) as ctx:
        digest = _publish(ctx, tmp_path, "one", b"an engine")
    aws_config = tmp_path / "aws-config"
    aws_config.write_text("[default]\nregion = us-east-1\n")

    cold = _fetch_fresh(config, digest, tmp_path / "out", AWS_CONFIG_FILE=str(aws_config))

    assert cold["digest"] == digest
    assert "boto3" in cold["modules"]  # type: ignore[operator]
    assert (tmp_path / "out" / "rank0.engine").read_bytes() == b"an engine"


def test_a_damaged_cached_manifest_is_not_trusted(tmp_path: Path, ctx: Context) -> None:
    """A copy that hashes to another digest (here: another artifact's valid manifest, as an
    edit that keeps it well-formed would) is removed and the store's manifest used."""
    first = _publish(ctx, tmp_path, "first", b"first engine")
    second = _publish(ctx, tmp_path, "second", b"second engine")
    fetch(ctx, first, tmp_path / "one")
    fetch(ctx, second, tmp_path / "two")
    copy = ctx.cache.manifest_path(Digest.parse(first))
    good = copy.read_bytes()
    copy.chmod(0o644)
    copy.write_bytes(ctx.cache.manifest_path(Digest.parse(second)).read_bytes())

    done = fetch(ctx, first, tmp_path / "three")

    assert str(done.manifest.digest) == first
    assert (tmp_path / "three" / "rank0.engine").read_bytes() == b"first engine"
    assert copy.read_bytes() == good  # replaced by the store's verified bytes


def test_a_damaged_cached_manifest_with_the_store_gone_fails_cleanly(
        tmp_path: Path, own_s3_server: S3Server) -> None:
    bucket = own_s3_server.create_bucket()
    config = _config(tmp_path, f"s3://{bucket}/p", own_s3_server.endpoint_url)
    with Context(config) as ctx:
        digest = _publish(ctx, tmp_path, "first", b"first engine")
        fetch(ctx, digest, tmp_path / "one")
        copy = ctx.cache.manifest_path(Digest.parse(digest))
    copy.chmod(0o644)
    copy.write_bytes(copy.read_bytes().replace(b"rank0", b"rank1"))
    own_s3_server.stop()

    with Context(config) as ctx, pytest.raises(StoreError):
        fetch(ctx, digest, tmp_path / "two")
    assert not (tmp_path / "two").exists()
    assert not copy.exists()  # the damaged copy is gone; the next fetch asks the store
