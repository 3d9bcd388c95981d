"""An S3 endpoint behind a private CA: the CA bundle boto3 trusts (AWS_CA_BUNDLE) is the one
fetch's ranged GETs trust too, so publish and fetch both reach it; without it, a fetch is
refused with one line, not a traceback, and nothing lands at the target."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import StoreError
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.fetch import fetch
from tests.integration.faulty_proxy import FaultyProxy
from tests.integration.s3server import S3Server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl(1)")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _private_ca(where: Path) -> tuple[Path, ssl.SSLContext]:
    """A private CA (its certificate is the bundle to trust) and a server context with a
    certificate for 127.0.0.1 that it signed, as an in-house MinIO would have."""
    ca, ca_key = where / "ca.pem", where / "ca.key"
    leaf, leaf_key, request = where / "leaf.pem", where / "leaf.key", where / "leaf.csr"
    extensions = where / "leaf.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                          "extendedKeyUsage=serverAuth\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=enginectl test CA", "-keyout", str(ca_key), "-out", str(ca),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", str(leaf_key), "-out", str(request))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "1", "-extfile", str(extensions), "-out", str(leaf))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf, leaf_key)
    return ca, context


def _context(tmp_path: Path, bucket: str, endpoint: str, cache: str) -> Context:
    return Context(RegistryConfig(
        home=tmp_path / "home", store_url=f"s3://{bucket}/tls", s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / cache))


def test_publish_and_fetch_through_an_endpoint_behind_a_private_ca(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, server_tls = _private_ca(tmp_path)
    source = tmp_path / "engine"
    source.mkdir()
    (source / "config.json").write_text('{"architecture": "LlamaForCausalLM"}')
    (source / "rank0.engine").write_bytes(b"an engine " * 100_000)
    spec = ImportSpec(kind="trtllm-engine", model="m", gpu="h100", status="ready")
    with FaultyProxy(s3_server.endpoint_url, lambda *_: "pass", tls=server_tls) as proxy:
        assert proxy.endpoint_url.startswith("https://")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
        with _context(tmp_path, s3_bucket, proxy.endpoint_url, "cache") as ctx:
            published = import_artifact(ctx, source, spec)
            fetched = fetch(ctx, published.digest, tmp_path / "out")
        assert fetched.downloaded_bytes == published.manifest.size
        assert proxy.ranges  # the blob GETs went over TLS to the proxy
        assert (tmp_path / "out" / "rank0.engine").read_bytes() == b"an engine " * 100_000

        monkeypatch.delenv("AWS_CA_BUNDLE")
        with _context(tmp_path, s3_bucket, proxy.endpoint_url, "cache2") as ctx, \
                pytest.raises(StoreError) as refused:
            fetch(ctx, published.digest, tmp_path / "out2")
    assert "\n" not in str(refused.value)
    assert "get_object" in str(refused.value)
    assert "TLS certificate is not trusted here: set AWS_CA_BUNDLE" in str(refused.value)
    assert not (tmp_path / "out2").exists()
