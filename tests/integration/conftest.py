"""Fixtures for integration tests: real servers over the network, one clean namespace per test.

    s3_server   (session)   moto's S3 server in its own process on a free loopback port;
                            fails, not skips, when it cannot start and CI=true
    s3rver_server (session) s3rver, started from $ENGINECTL_S3RVER (scripts/install-s3rver;
                            scripts/test sets it), which checks SigV4 signatures; fails, not
                            skips, when missing and CI=true
    each_s3_server          s3_server, then s3rver_server: for the few tests of what
                            enginectl signs itself (presigned part PUTs and GETs)
    each_s3_bucket          a unique, empty bucket on each_s3_server, removed afterwards
    aws_env     (autouse)   test credentials and region, nothing from the user's AWS config
                            (asked for by `_test_credentials` here and in tests/deploy)
    s3_bucket               a unique, empty bucket on s3_server, removed afterwards
    store                   an opened Store, once per backend: "file" and "s3" (a test can
                            ask for "s3rver" too, as an indirect parameter)
    ctx                     a registry Context on `store` and `registry_url` (every store
                            × database), with a cache of its own
    env                     a builder's environment on TensorRT-LLM's stand-ins with its own
                            home and `registry_url` (a module may define its own)
    any_env                 the same on either registry: SQLite, or an empty PostgreSQL schema
    box                     the nightly's toy box (tests/integration/nightly_box.py), built
                            once, at a max_regression no machine noise can hold
    chromium    (session)   headless Chromium from scripts/install-browser; skips without it,
                            fails under CI=true
    tiny_model  (module)    scripts/make_tiny_model.py's Llama (made once per run and
                            copied: tests.models.make_tiny_model), for the engine chat and warm
                            cache tests

The S3 fixtures above (s3_server to store) are in tests/integration/s3_fixtures.py and the
registry database's (registry_url, postgres_url, registry) in tests/integration/db_fixtures.py:
plugins the root conftest loads, so tests/deploy and tests/ray use them without importing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.store.base import Store
from tests.helpers import ROOT, builder_env
from tests.integration.nightly_box import Box
from tests.integration.s3server import S3Server
from tests.models import make_tiny_model, unavailable


@pytest.fixture(autouse=True)
def _test_credentials(aws_env: None) -> None:
    """Every integration test sees test credentials, never the user's AWS account."""


@pytest.fixture
def ctx(
    store: Store, registry_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Context]:
    endpoint = None
    if store.url.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        endpoint = server.endpoint_url
    config = RegistryConfig(
        home=tmp_path / "home", store_url=store.url, s3_endpoint_url=endpoint,
        registry_url=registry_url, cache_dir=tmp_path / "cache",
    )
    context = Context(config)
    yield context
    context.close()


@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    return builder_env(tmp_path, registry_url)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """A builder's environment on either registry (SQLite, or an empty PostgreSQL schema)."""
    url = (f"sqlite:///{tmp_path / 'home' / 'registry.db'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))
    return builder_env(tmp_path, url)


@pytest.fixture
def box(tmp_path: Path, registry_url: str) -> Box:
    """The toy box, built; its tests weigh no gate or alarm numbers, so at max_regression 0.99
    (a candidate 100x slower) no load on the machine can hold a promotion or raise the alarm."""
    built = Box(tmp_path, registry_url, max_regression=0.99)
    built.run("build", str(built.recipe))
    return built


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_model.py's Llama: a byte-level BPE tokenizer, a Llama-3 chat
    template, an HF config.json (made here, nothing from a hub)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", factory=tmp_path_factory)


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of headless Chromium, installed by scripts/install-browser."""
    import subprocess

    done = subprocess.run([str(ROOT / "scripts" / "install-browser")], capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0:
        unavailable(f"cannot install chromium: {done.stderr.strip()[-500:]}",
                    "integration servers are")
    return done.stdout.strip().splitlines()[-1]
