"""Configuration enters at the top: a nightly and a smoke run through the Python API go to
the registry and store of the Context they are handed, never to the environment's. The
environment (ENGINECTL_*) names registry A; the Context handed in is registry B's (SQLite or
PostgreSQL): only B changes. The toy box of the nightly tests: an "H100" from the
nvidia-smi stand-in, TensorRT-LLM's programs through their stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.nightly.report import as_json
from pipeline.nightly.run import nightly
from pipeline.serving.smoke_here import smoke_artifact
from pipeline.settings import Settings
from registry.config import RegistryConfig
from registry.context import Context
from registry.sql.alias_records import get_alias
from registry.sql.db import open_registry
from registry.sql.smoke_records import smoke_reports
from tests.helpers import builder_env
from tests.integration.nightly_box import ENGINE_ALIAS, ENGINE_TARGET, NEW, Box

pytestmark = pytest.mark.waits  # on the stand-in server: spread (tests/conftest.py)


def test_a_nightly_and_a_smoke_change_only_the_registry_they_are_handed(
    tmp_path: Path, registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Box(tmp_path / "b", registry_url, max_regression=0.99)  # registry B, built
    box.run("build", str(box.recipe))
    with open_registry(registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)
    assert old_engine is not None

    home_a = tmp_path / "a" / "home"
    env_a = {**box.env, **builder_env(tmp_path / "a", f"sqlite:///{home_a / 'registry.db'}")}
    for name, value in env_a.items():  # this process's environment: registry A
        monkeypatch.setenv(name, value)
    box.bump(NEW)  # the driver moves: the engine is rebuilt, re-proven and gated

    config_b = RegistryConfig.from_env(box.env)
    settings_b = Settings.from_env(box.env)
    with Context(config_b) as ctx:
        report = nightly(ctx=ctx, settings=settings_b)
    assert report.exit_code == 0, as_json(report)
    [engine] = [t for r in report.recipes for t in r.targets if t.id == ENGINE_TARGET]
    assert engine.verdict == "promoted", engine
    with open_registry(registry_url) as registry, registry.session() as session:
        new_engine = get_alias(session, ENGINE_ALIAS)
        proofs = len(smoke_reports(session, new_engine or ""))
    assert new_engine not in (None, old_engine)

    with Context(config_b) as ctx:
        digest, smoked = smoke_artifact(ENGINE_ALIAS, ctx=ctx, settings=settings_b)
    assert (digest, smoked.passed) == (new_engine, True)
    with open_registry(registry_url) as registry, registry.session() as session:
        assert len(smoke_reports(session, digest)) == proofs + 1

    assert not home_a.exists()  # A's registry, store and work directory: never made
