"""An alias never sends a node an artifact that cannot run on its toolchain: after a
TensorRT-LLM bump the nightly rebuilds the toy's engine and moves its alias; a node still on
the old TensorRT-LLM that pulls the alias gets the alias's earlier target, proven there, with
one line saying so, a node on the new one gets the new engine, and a node on a release no
target was proven on is exit 6 naming what the alias needs.

Two nodes are two environments (homes, caches, the TensorRT-LLM their Python reports) against
one registry and store. The TensorRT-LLM a machine has is what enginectl reads from its
Python's distributions (`tensorrt_llm`'s metadata, as in a release image); the stand-ins
play the same release (FAKE_TRTLLM_VERSION: trtllm-build records it in an engine's
config.json and trtllm-serve refuses an engine of another release, as TensorRT does).
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from registry.sql.alias_records import get_alias
from registry.sql.alias_targets import alias_targets
from registry.sql.db import open_registry
from tests.helpers import builder_env, stderr_of
from tests.integration.nightly_box import ENGINE_ALIAS, ENGINE_TARGET, Box, target

pytestmark = pytest.mark.waits  # a nightly on the stand-ins: spread (tests/conftest.py)

OLD, NEW, OLDER = "1.2.1", "1.3.0", "1.1.0"


def trtllm_python(root: Path, version: str) -> str:
    """A Python (this one) that also sees a `tensorrt_llm` distribution of *version*: what a
    TensorRT-LLM image's Python reports (rewrite it to bump)."""
    site = root / "site"
    shutil.rmtree(site, ignore_errors=True)
    info = site / f"tensorrt_llm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" '
                      f'exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)


def node(box: Box, root: Path, version: str) -> dict[str, str]:
    """A deploy node on TensorRT-LLM *version*: its own home and cache, the box's registry
    and store, the same GPU."""
    env = builder_env(root, box.registry_url)
    return {**env, **box.gpu, "ENGINECTL_STORE_URL": (box.cwd / "home" / "store").as_uri(),
            "ENGINECTL_CACHE_DIR": str(root / "cache"), "FAKE_TRTLLM_VERSION": version,
            "ENGINECTL_PYTHON": trtllm_python(root / "python", version)}


@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_a_node_on_the_old_trtllm_gets_the_aliases_earlier_target(
    tmp_path: Path, registry_url: str
) -> None:
    box = Box(tmp_path, registry_url, max_regression=0.99)
    builder = tmp_path / "builder"
    box.env.update(ENGINECTL_PYTHON=trtllm_python(builder, OLD), FAKE_TRTLLM_VERSION=OLD)
    box.run("build", str(box.recipe))
    with open_registry(box.registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)

    box.env.update(ENGINECTL_PYTHON=trtllm_python(builder, NEW), FAKE_TRTLLM_VERSION=NEW)
    report = box.nightly(code=None)
    assert target(report, ENGINE_TARGET)["verdict"] == "promoted", report["text"]
    with open_registry(box.registry_url) as registry, registry.session() as session:
        new_engine = get_alias(session, ENGINE_ALIAS)
    assert new_engine not in (None, old_engine)
    moves = alias_targets(box.registry_url, ENGINE_ALIAS)
    assert [t.digest for t in moves] == [new_engine, old_engine]
    assert [t.built.get("trtllm") for t in moves] == [NEW, OLD]
    assert {p.get("trtllm") for p in moves[1].proofs} == {OLD}

    on_new = node(box, tmp_path / "node-new", NEW)
    pulled = box.run("pull", ENGINE_ALIAS, "-o", str(tmp_path / "new"), "--json", env=on_new)
    assert json.loads(pulled.stdout)["digest"] == new_engine
    assert stderr_of(pulled) == ""  # no note (with --json, no summary line either)

    on_old = node(box, tmp_path / "node-old", OLD)
    pulled = box.run("pull", ENGINE_ALIAS, "-o", str(tmp_path / "old"), "--json", env=on_old)
    assert json.loads(pulled.stdout)["digest"] == old_engine
    assert stderr_of(pulled).splitlines() == [(
        f"enginectl: note: {ENGINE_ALIAS} points at {new_engine[:19]}…, which needs trtllm "
        f"{NEW} (this node has trtllm {OLD}); pulling its earlier target {old_engine} since "
        f"{moves[1].since:%Y-%m-%d %H:%M}, which runs here")]
    served = json.loads((tmp_path / "old" / "serve.json").read_text())
    assert served["digest"] == old_engine

    on_older = node(box, tmp_path / "node-older", OLDER)
    refused = box.run("pull", ENGINE_ALIAS, "-o", str(tmp_path / "older"), code=6,
                      env=on_older)
    assert (f"enginectl: error: {ENGINE_ALIAS} needs trtllm {NEW}: its target "
            f"{new_engine[:19]}… was proven only there, and this node has trtllm {OLDER}"
            in refused.stderr)
    assert not (tmp_path / "older").exists()
