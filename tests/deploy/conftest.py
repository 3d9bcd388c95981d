"""Fixtures for the deploy tests: the integration servers (a real S3 server over HTTP, real
PostgreSQL) and a context on each store × registry pair.

    store, registry_url, s3_server, aws_env   as tests/integration provides them
    ctx                                        a Context on that store and registry
    deploy_env                                 the same as environment variables, for the CLI
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.store import Store
from tests.integration.conftest import aws_env, s3_bucket, s3_server, store
from tests.integration.db_fixtures import *  # noqa: F403 - the SQL registry fixtures
from tests.integration.s3server import S3Server

__all__ = ["aws_env", "s3_bucket", "s3_server", "store"]  # fixtures, re-exported


@pytest.fixture
def ctx(store: Store, registry_url: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> Iterator[Context]:
    endpoint = None
    if store.url.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        endpoint = server.endpoint_url
    config = RegistryConfig(home=tmp_path / "home", store_url=store.url,
                            s3_endpoint_url=endpoint, registry_url=registry_url,
                            cache_dir=tmp_path / "home" / "cache")
    with Context(config) as context:
        yield context


@pytest.fixture
def deploy_env(ctx: Context) -> dict[str, str]:
    """The environment that makes the CLI use *ctx*'s store, registry and home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env.update(ENGINECTL_HOME=str(ctx.config.home), ENGINECTL_STORE_URL=ctx.config.store_url,
               ENGINECTL_REGISTRY_URL=ctx.config.registry_url,
               ENGINECTL_CACHE_DIR=str(ctx.config.cache_dir), HF_HUB_OFFLINE="1")
    if ctx.config.s3_endpoint_url:
        env["ENGINECTL_S3_ENDPOINT_URL"] = ctx.config.s3_endpoint_url
    return env
