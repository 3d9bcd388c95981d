"""Reads never write (issue 21, point 5): the commands that only read the registry (ls, show,
resolve, pull, compare, logs, info, plan) never create a SQLite file or its folder and never
create or migrate a table. A registry that is missing, empty, behind or ahead is one line
naming it and what to run, exit 4, except that before the embedded default registry was
made `ls` lists nothing (exit 0) and `show` finds nothing (exit 6); writing commands (and
`enginectl db upgrade`) still create it. Run as a user runs them, on SQLite files and a real
PostgreSQL schema."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from registry.config import masked_url
from registry.sql.db import open_registry
from registry.sql.engine import make_engine
from registry.sql.schema import HEAD, current, migrations_dir
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import ROOT
from tests.integration.db_fixtures import stamp

RECIPE = ROOT / "recipes" / "llama70b-h100.yaml"
FUTURE_REVISION = "9999_from_a_newer_enginectl"

# Every command that reads the SQL registry through SQLAlchemy; OUT is a target directory.
READS = [
    ["ls"],
    ["ls", "--model", "m", "--json"],
    ["show", "m/prod"],
    ["resolve", "--model", "m", "--gpu", "h100"],
    ["compare", "--model", "m"],
    ["logs", "m/prod"],
    ["pull", "--model", "m", "--gpu", "h100", "-o", "OUT"],
    ["serve", "--model", "m", "--gpu", "h100"],
    ["show", "0123456789ab"],
]
# fetch and pull by REF read the registry without SQLAlchemy (registry.sql.lookup), and read
# the two tables they need on any schema: a deploy node is not upgraded with the builders
BY_REF = [["pull", "m/prod", "-o", "OUT"], ["fetch", "m/prod", "-o", "OUT"]]
# one of each verb, for the schema states (every verb opens the registry the same way)
VERBS = [READS[0], *READS[2:7]]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "ENGINECTL_VLLM_PYTHON": "python3",
           **extra}
    env.pop("ENGINECTL_WORK_DIR", None)
    return env


def _run(env: dict[str, str], args: list[str], tmp_path: Path
         ) -> subprocess.CompletedProcess[str]:
    argv = [str(tmp_path / "out") if part == "OUT" else part for part in args]
    return run_cli([ENGINECTL, *argv], env=env, timeout=300, cwd=tmp_path)


def _refused(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The one error line of *done*, exit 4, which holds every fragment."""
    assert done.returncode == 4, (done.args, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("enginectl: error: "), done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, (fragment, done.stderr)
    return done.stderr


def _tables(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return sorted(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _downgrade(url: str, revision: str) -> None:
    """Migrate the registry at *url* down to *revision* with Alembic, as an older
    enginectl would have left it."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(migrations_dir()))
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("default", [True, False], ids=["embedded-default", "mistyped-path"])
def test_a_missing_sqlite_registry_is_one_line_and_nothing_is_created(
    tmp_path: Path, default: bool
) -> None:
    typo = tmp_path / "no" / "such" / "registry.db"
    extra = {} if default else {"ENGINECTL_REGISTRY_URL": f"sqlite:///{typo}"}
    env = _env(tmp_path, **extra)
    url = f"sqlite:///{tmp_path / 'home' / 'registry.db'}" if default else f"sqlite:///{typo}"
    for args in READS + BY_REF:
        done = _run(env, args, tmp_path)
        if default and args[0] == "ls":  # nothing built yet: an empty list, not an error
            assert (done.returncode, done.stderr) == (0, ""), done.stderr
            assert done.stdout.strip() == ("[]" if "--json" in args else "no artifacts match")
            continue
        if default and args[0] == "show":  # nothing is called that yet: not found
            assert done.returncode == 6, done.stderr
            assert done.stderr == (
                f"enginectl: error: no artifact or alias {args[1]!r} in the registry; nothing "
                "was built or imported yet: `enginectl build RECIPE` or `enginectl import "
                "DIR` adds one\n")
            continue
        _refused(done, f"no registry at {url} (the file does not exist)",
                 "`enginectl db upgrade` creates it")
    plan = _run(env, ["plan", str(RECIPE), "--json"], tmp_path)
    assert plan.returncode == 0, plan.stderr  # nothing is built yet: plan says so
    info = _run(env, ["info"], tmp_path)
    assert info.returncode == 0, info.stderr
    assert "no registry yet: `enginectl db upgrade` creates it" in info.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no home, folder or file made

    # a writing command creates it, on the embedded default or at the path given
    upgraded = _run(env, ["db", "upgrade"], tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    assert current(url) == HEAD
    listed = _run(env, ["ls", "--json"], tmp_path)
    assert (listed.returncode, listed.stdout.strip()) == (0, "[]")


def test_a_writing_command_still_creates_the_embedded_default(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = _run(env, ["untag", "m/prod"], tmp_path)  # a write: it opens (and makes) it
    assert done.returncode == 6, done.stderr  # then finds no such alias
    assert current(f"sqlite:///{tmp_path / 'home' / 'registry.db'}") == HEAD


def test_an_empty_postgres_database_gets_no_tables_from_a_read(
    tmp_path: Path, postgres_url: str
) -> None:
    env = _env(tmp_path, ENGINECTL_REGISTRY_URL=postgres_url)
    for args in READS + BY_REF:
        _refused(_run(env, args, tmp_path), f"registry {masked_url(postgres_url)} is empty",
                 "`enginectl db upgrade` creates it")
    info = _run(env, ["info", "--json"], tmp_path)
    assert info.returncode == 0, info.stderr
    plan = _run(env, ["plan", str(RECIPE), "--json"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert _tables(postgres_url) == []  # before the fix, `ls` made 12
    assert _run(env, ["db", "upgrade"], tmp_path).returncode == 0
    assert "artifacts" in _tables(postgres_url)
    listed = _run(env, ["ls", "--json"], tmp_path)
    assert (listed.returncode, listed.stdout.strip()) == (0, "[]")


def test_a_registry_behind_this_enginectl_is_named_and_left_as_it_is(
    tmp_path: Path, registry_url: str
) -> None:
    open_registry(registry_url).close()
    _downgrade(registry_url, "0002")
    env = _env(tmp_path, ENGINECTL_REGISTRY_URL=registry_url)
    for args in VERBS:
        _refused(_run(env, args, tmp_path), f"registry schema 0002 is behind this enginectl "
                 f"(head {HEAD}); run `enginectl db upgrade`")
    assert current(registry_url) == "0002"  # not migrated by reading (SQLite used to be)
    assert _run(env, ["db", "upgrade"], tmp_path).returncode == 0
    assert current(registry_url) == HEAD
    assert _run(env, ["ls"], tmp_path).returncode == 0


def test_a_registry_ahead_of_this_enginectl_says_to_upgrade_enginectl(
    tmp_path: Path, registry_url: str
) -> None:
    open_registry(registry_url).close()
    stamp(registry_url, FUTURE_REVISION)
    env = _env(tmp_path, ENGINECTL_REGISTRY_URL=registry_url)
    for args in VERBS:
        _refused(_run(env, args, tmp_path), f"registry schema {FUTURE_REVISION} is newer than "
                 f"this enginectl (knows up to {HEAD}); upgrade enginectl")
    assert current(registry_url) == FUTURE_REVISION
