"""A build with nothing to do (`pipeline.executors.noop`) reads the registry through its
driver alone, and reports what the full path reports; anything to do or to write sends it the
full way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import text

from registry.sql.db import open_registry
from registry.sql.nightly_runs import last_probes
from registry.sql.records import list_artifacts, mark_deleted
from tests.integration.builds import build, counts, write_recipe

# `enginectl build` as the console script runs it, then which heavy modules it had loaded
BUILD_AND_LIST_MODULES = (
    "import json, sys\nfrom pipeline.cli import entry\n"
    "out = sys.argv.pop(1)\nsys.argv[0] = 'enginectl'\ncode = 0\n"
    "try:\n    entry()\nexcept SystemExit as exc:\n    code = exc.code\n"
    "heavy = {'sqlalchemy', 'alembic', 'boto3', 'ray', 'torch'}\n"
    "with open(out, 'w') as sink:\n"
    "    json.dump({'code': code, 'modules': sorted({m.split('.')[0] for m in sys.modules} "
    "& heavy)}, sink)\n"
)


def build_listing_modules(env: dict[str, str], recipe: Path, tmp_path: Path,
                          *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    listing = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", BUILD_AND_LIST_MODULES, str(listing), "build",
                           str(recipe), *args], env=env, text=True, capture_output=True,
                          timeout=600, check=False)
    found: dict[str, Any] = json.loads(listing.read_text())
    assert found["code"] in (0, None), (done.stdout, done.stderr)
    return done, found


def by_key(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {stage["key"]: stage for stage in summary["stages"]}


def test_a_noop_build_imports_no_orm_and_reports_as_the_full_path(
        env: dict[str, str], tmp_path: Path, registry_url: str) -> None:
    recipe = write_recipe(tmp_path)
    first = json.loads(build(env, recipe, "--json", "--jobs", "3").stdout)
    assert (first["built"], first["pending_smoke"]) == (6, 4)

    # the recipe text forgotten: the build has a row to write, so it takes the full path
    with open_registry(registry_url) as registry, registry.session() as session:
        session.execute(text("DELETE FROM recipes"))  # raw: no registry verb forgets a recipe
    done, full_run = build_listing_modules(env, recipe, tmp_path, "--json")
    assert "sqlalchemy" in full_run["modules"]
    full = json.loads(done.stdout)

    done, noop_run = build_listing_modules(env, recipe, tmp_path, "--json")
    assert noop_run["modules"] == []  # no SQLAlchemy, no Alembic, no boto3
    noop = json.loads(done.stdout)
    assert {k: v for k, v in noop.items() if k != "stages"} == \
        {k: v for k, v in full.items() if k != "stages"}
    assert (noop["built"], noop["reused"], noop["pending_smoke"]) == (0, 6, 4)
    assert noop["saved_seconds"] > 0
    assert by_key(noop) == by_key(full)  # the same outcomes, digests, times and reasons
    # the reuses in plan order, then the smoke runs, as the walk reports them
    stages = [s["stage"] for s in noop["stages"]]
    assert stages[-4:] == ["smoke"] * 4
    assert "smoke" not in stages[:-4]

    text_run, modules = build_listing_modules(env, recipe, tmp_path)
    assert modules["modules"] == []
    assert counts(text_run.stdout) == {"built": 0, "reused": 6, "failed": 0, "skipped": 0}
    assert any(line.startswith("reused  convert") for line in text_run.stdout.splitlines())
    assert "4 artifacts await a smoke run" in text_run.stdout

    dry, modules = build_listing_modules(env, recipe, tmp_path, "--dry-run", "--json")
    assert modules["modules"] == []
    planned = json.loads(dry.stdout)
    assert sum(1 for s in planned["stages"] if s["built"]) == 6


def test_a_deleted_artifact_is_rebuilt_and_a_new_probe_recorded(
        env: dict[str, str], tmp_path: Path, registry_url: str) -> None:
    recipe = write_recipe(tmp_path)
    build(env, recipe, "--json", "--only", "*/small/trtllm")
    with open_registry(registry_url) as registry, registry.session() as session:
        (engine,) = list_artifacts(session, kind="trtllm-engine")
        mark_deleted(session, engine.digest)
    done, modules = build_listing_modules(env, recipe, tmp_path, "--json", "--only",
                                          "*/small/trtllm")
    again = json.loads(done.stdout)
    assert (again["built"], again["reused"]) == (1, 2)  # the engine; snapshot and convert
    assert "sqlalchemy" in modules["modules"]

    # another toolchain on this machine (a new builder image) is recorded by a full build
    image = {**env, "ENGINECTL_IMAGE_DIGEST": "sha256:" + "ab" * 32}
    build(image, recipe, "--json", "--only", "*/small/trtllm")
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        last = max(last_probes(session).values(), key=lambda probe: probe.probed_at)
    assert last.fingerprint["image"] == "sha256:" + "ab" * 32
