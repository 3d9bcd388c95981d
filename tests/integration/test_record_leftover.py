"""A process killed while it published a record (a status change, a smoke report, an alias
move) to a file store leaves the temp file it was writing beside where the record would have
gone (`records/sha256/<digest>/status/.<at>-<hex>.json.<hex>.tmp`). That is no record:
`reindex` into an empty registry and `fsck` pass over it (reindex exited 4 on its name), and
`gc` removes it once it is older than its grace period, as it removes a killed writer's
half-written blob."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import expect_exit
from tests.integration.engines import make_engine


def enginectl(env: dict[str, str], *args: str, code: int = 0) -> str:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    expect_exit(done, code)
    return done.stdout


def test_a_records_temp_leftover_is_passed_over_by_reindex_and_fsck_and_removed_by_gc(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_STORE_URL": store.as_uri(), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'registry.db'}"}
    digest = json.loads(enginectl(env, "import", str(make_engine(tmp_path / "engine")),
                                  "--kind", "trtllm-engine", "--model", "m", "--gpu",
                                  "NVIDIA H100 80GB HBM3", "--quant", "fp8", "--ready",
                                  "--json"))["digest"]
    [status] = sorted((store / "records").rglob("status/*.json"))[-1:]
    # what the file store's atomic write leaves when killed between its write and its rename
    leftover = status.with_name(f".{status.name}.{secrets.token_hex(8)}.tmp")
    leftover.write_bytes(status.read_bytes()[:20])

    fresh = {**env, "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    reindexed = json.loads(enginectl(fresh, "reindex", "--json"))
    assert reindexed["problems"] == []
    assert reindexed["artifacts"] == 1
    listed = json.loads(enginectl(fresh, "ls", "--json"))
    assert [(row["digest"], row["status"]) for row in listed] == [(digest, "ready")]
    enginectl(fresh, "fsck")

    enginectl(env, "gc")  # within its grace period: it may be a publish in flight
    assert leftover.exists()
    enginectl(env, "gc", "--grace", "0s")
    assert not leftover.exists()
    assert status.exists()
    enginectl(env, "fsck")
