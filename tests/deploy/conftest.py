"""Fixtures for the deploy tests: the integration servers (a real S3 server over HTTP, real
PostgreSQL) and a context on each store × registry pair.

    store, registry_url, s3_server, aws_env   the root conftest's plugins (tests/integration's)
    ctx                                        a Context on that store and registry
    deploy_env                                 the same as environment variables, for the CLI
    user                                       a user with two ready engines on the file store
                                               and SQLite (tests/deploy/user_cli.py runs them)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.store.base import Store
from tests.deploy.user_cli import run
from tests.integration.engines import make_engine
from tests.integration.s3server import S3Server


@pytest.fixture(autouse=True)
def _test_credentials(aws_env: None) -> None:
    """Every deploy test sees test credentials, never the user's AWS account."""


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


@pytest.fixture
def user(tmp_path: Path) -> dict[str, str]:
    """A user with two ready engines on the file store; its environment, with the digests
    as ENGINE_A and ENGINE_B (not read by enginectl)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env.update(ENGINECTL_HOME=str(tmp_path / "home"), ENGINECTL_CACHE_DIR=str(tmp_path / "cache"),
               HOME=str(tmp_path / "user"), HF_HUB_OFFLINE="1")
    (tmp_path / "user").mkdir()
    (tmp_path / "work" / "sub").mkdir(parents=True)
    for name, seed in (("A", 0), ("B", 1)):
        engine = make_engine(tmp_path / f"engine-{name}", seed=seed)
        done = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
                   "--gpu", "h100", "--ready", "--json")
        env[f"ENGINE_{name}"] = json.loads(done.stdout)["digest"]
    return env
