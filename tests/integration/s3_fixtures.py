"""The S3 fixtures (a pytest plugin the root conftest loads; tests/integration/conftest.py
lists them): moto's server and s3rver in their own processes on free loopback ports, a unique
bucket per test, test credentials, and an opened Store per backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from registry.store.base import Store
from registry.store.opener import open_store
from tests.integration.s3server import (
    CLEARED,
    CREDENTIALS,
    S3_SERVERS,
    S3RVER_VARIABLE,
    S3Server,
    S3ServerError,
    start_s3_server,
    start_s3rver,
)
from tests.models import unavailable


def _unavailable(reason: str) -> NoReturn:
    unavailable(reason, "integration servers are")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        import moto.server  # noqa: F401 - only to know whether it is installed
    except ImportError as exc:
        _unavailable(f"moto's S3 server is not installed (the [test] extra): {exc}")
    try:
        server = start_s3_server(tmp_path_factory.mktemp("s3server"))
    except (S3ServerError, OSError) as exc:
        _unavailable(f"cannot start the S3 test server: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3rver_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    start_script = os.environ.get(S3RVER_VARIABLE, "")
    if not start_script:
        _unavailable(f"{S3RVER_VARIABLE} is not set: run scripts/install-s3rver and set it to "
                     "the path it prints (scripts/test does both)")
    if not os.access(start_script, os.X_OK):
        _unavailable(f"{S3RVER_VARIABLE}={start_script} is not an executable file: run "
                     "scripts/install-s3rver")
    try:
        server = start_s3rver(Path(start_script), tmp_path_factory.mktemp("s3rver"))
    except (S3ServerError, OSError) as exc:
        _unavailable(f"cannot start s3rver: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=S3_SERVERS)
def each_s3_server(request: pytest.FixtureRequest) -> S3Server:
    """moto's server, then s3rver: for the tests of what enginectl signs itself."""
    name = "s3_server" if request.param == "moto" else "s3rver_server"
    server: S3Server = request.getfixturevalue(name)
    return server


@pytest.fixture
def each_s3_bucket(each_s3_server: S3Server) -> Iterator[str]:
    name = each_s3_server.create_bucket()
    yield name
    each_s3_server.delete_bucket(name)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Test credentials and region, never the user's AWS account (the integration and deploy
    conftests use it for every test)."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    name = s3_server.create_bucket()
    yield name
    s3_server.delete_bucket(name)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store of each backend; a test can ask for "s3rver" too (indirect parameter)."""
    if request.param == "file":
        yield open_store((tmp_path / "store").as_uri())
        return
    server: S3Server = request.getfixturevalue(
        "s3rver_server" if request.param == "s3rver" else "s3_server")
    bucket = server.create_bucket()
    yield open_store(f"s3://{bucket}/prefix", s3_endpoint_url=server.endpoint_url)
    server.delete_bucket(bucket)
