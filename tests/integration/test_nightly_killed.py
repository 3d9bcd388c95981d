"""A nightly killed with `kill -9` after its probe is finished by the next one, on SQLite and
PostgreSQL, with the toy box of tests/integration/nightly_box.py.

The kill lands at a deterministic point: once the promotion gate has begun (its log
directory, `$ENGINECTL_WORK_DIR/gate/`, exists), when the new driver's engine is built and
proven `ready` and its alias has not moved yet. The killed run recorded the new driver's
probe; the next nightly must still compare with the toolchain the last finished nightly (or,
before any, the build) left, find the bump's work (the keys are built now: reused), gate and
promote, and a third run then finds nothing to do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from registry.sql.alias_records import get_alias
from registry.sql.db import open_registry
from registry.sql.records import get_status
from tests.integration.nightly_box import (
    CHECKPOINT_ALIAS,
    ENGINE_ALIAS,
    ENGINE_TARGET,
    ENGINECTL,
    NEW,
    OLD,
    Box,
    target,
)
from tests.processes import TAG, tagged_processes

pytestmark = pytest.mark.waits  # on the stand-in server: spread (tests/conftest.py)

GUARD_S = 300  # a guard against a hang, not a timing assertion
CHECKPOINT_TARGET = ENGINE_TARGET.replace("/trtllm", "/trtllm-pytorch")


def kill_in_gate(box: Box, tag: str) -> None:
    """Start `enginectl nightly` and `kill -9` it once its promotion gate has begun; wait
    until nothing it started runs any more."""
    gate = Path(box.env["ENGINECTL_HOME"]) / "work" / "gate"
    nightly = subprocess.Popen([ENGINECTL, "nightly", "--json"], cwd=box.cwd, text=True,
                               env={**box.env, TAG: tag}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + GUARD_S
        while not gate.exists():
            assert nightly.poll() is None, nightly.communicate()
            assert time.monotonic() < deadline, "the nightly never reached its gate"
            time.sleep(0.05)
        os.kill(nightly.pid, signal.SIGKILL)  # the nightly alone: it cannot clean up
        nightly.communicate(timeout=GUARD_S)
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tagged_processes(tag) == []
    finally:  # what a failure leaves behind is ours to end
        for pid in tagged_processes(tag):
            os.kill(pid, signal.SIGKILL)
        if nightly.poll() is None:
            nightly.kill()
            nightly.communicate()


def test_a_nightly_killed_in_its_gate_is_finished_by_the_next_one(box: Box) -> None:
    with open_registry(box.registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)
        checkpoint = get_alias(session, CHECKPOINT_ALIAS)
    box.bump(NEW)
    kill_in_gate(box, uuid.uuid4().hex)
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == old_engine  # killed before the move

    report = box.nightly()
    assert not report["nothing_changed"]
    assert report["exit_code"] == 0
    assert report["settled"]
    assert report["pools"][0]["changes"][0] == {"field": "driver", "old": OLD, "new": NEW}
    engine = target(report, ENGINE_TARGET)
    assert engine["verdict"] == "promoted", engine
    assert all(s["because"] == [f"driver {OLD} → {NEW}"] for s in engine["stages"])
    [moved] = engine["promotions"]
    assert moved["old"] == old_engine
    assert target(report, CHECKPOINT_TARGET)["verdict"] == "re-proved"
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == moved["new"] != old_engine
        assert get_alias(session, CHECKPOINT_ALIAS) == checkpoint
        assert get_status(session, old_engine) == "superseded"

    again = json.loads(box.run("nightly", "--json").stdout)
    assert again["nothing_changed"]
