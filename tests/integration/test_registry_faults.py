"""A damaged registry file: one line, exit 4, the file and `enginectl reindex` named, the
file untouched; and reindex rebuilds from the store (issue 10, item 6). SQLite only: the
faults are of a file."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import make_engine


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([ENGINECTL, *args], env=env, timeout=300)


@pytest.fixture
def home(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A home whose registry holds a ready, aliased artifact; its checkpointed bytes."""
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache")}
    engine = make_engine(tmp_path / "engine")
    done = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m", "--gpu",
               "h100", "--ready", "--json")
    digest = json.loads(done.stdout)["digest"]
    assert run(env, "tag", digest, "m/prod").returncode == 0
    import sqlite3

    database = tmp_path / "home" / "registry.db"
    # raw: the test damages the database file itself, so everything goes into the main file
    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return env, database


FAULTS: dict[str, Callable[[bytes], bytes]] = {
    "garbage": lambda data: os.urandom(len(data)),
    "truncated": lambda data: data[: len(data) // 3],
    "scrambled": lambda data: data[:100] + bytes(reversed(data[100:])),
    "empty": lambda _data: b"",
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("command", [["ls"], ["fetch", "m/prod", "-o", "OUT"],
                                     ["show", "m/prod"], ["gc", "--dry-run"], ["fsck"]])
def test_a_damaged_registry_file_is_one_line_exit_4_and_left_alone(
    home: tuple[dict[str, str], Path], tmp_path: Path, fault: str, command: list[str]
) -> None:
    env, database = home
    for side in database.parent.glob("registry.db-*"):
        side.unlink()
    database.write_bytes(FAULTS[fault](database.read_bytes()))
    before = database.read_bytes()
    done = run(env, *[str(tmp_path / "out") if part == "OUT" else part for part in command])
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert str(database) in done.stderr
    assert "`enginectl reindex`" in done.stderr
    if fault == "empty":
        assert "empty (0 bytes)" in done.stderr
    assert database.read_bytes() == before  # never silently a new registry
    assert not (tmp_path / "out").exists()


def test_moved_aside_a_damaged_registry_is_rebuilt_by_reindex(
    home: tuple[dict[str, str], Path],
) -> None:
    env, database = home
    database.write_bytes(b"")
    database.rename(database.with_name("registry.db.damaged"))
    done = run(env, "reindex")
    assert done.returncode == 0, done.stderr
    listed = json.loads(run(env, "ls", "--json").stdout)
    assert [(row["status"], row["aliases"]) for row in listed] == [("ready", ["m/prod"])]
