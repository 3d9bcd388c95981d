"""A lease taken away from its holder while it works (the row's owner changes under it): the
stage's tool or the nightly is stopped, says who took the lease, and publishes nothing; a
heartbeat calls on_lost once. Leases kept through dropped connections: test_heartbeat.py;
taken over from a gone holder: test_lease_takeover.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

from sqlalchemy import select

from registry.sql.db import open_registry
from registry.sql.heartbeat import Heartbeat
from registry.sql.leases import NIGHTLY_KEY, try_acquire_nightly
from registry.sql.models import NightlyRun
from tests.helpers import wait_gone
from tests.integration.builds import (
    ENGINECTL,
    GUARD_S,
    SMALL_ENGINE,
    build,
    engine_key,
    engines,
    lease_of,
    start,
    take_over,
    wait_for_pidfile,
    write_recipe,
)


def test_a_lease_taken_away_stops_the_stage_and_says_why(
    any_env: dict[str, str], tmp_path: Path
) -> None:
    """Another builder takes the engine's lease over while its tool runs (the row's owner
    changes): the heartbeat's next renewal finds it gone, the tool's process group is
    stopped, the run fails with who took the lease (exit 3; nothing blamed on an artifact,
    nothing published) and the row stays the new holder's."""
    env = {**any_env, "ENGINECTL_LEASE_TTL_S": "3"}
    url = env["ENGINECTL_REGISTRY_URL"]
    recipe = write_recipe(tmp_path)
    engine = engine_key(env, recipe)
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    proc = start(hanging, recipe, "--only", SMALL_ENGINE)
    tool = wait_for_pidfile(proc, pidfile)
    try:
        take_over(url, engine, owner="thief:7:cafe", host="elsewhere", pid=7)
        out, err = proc.communicate(timeout=GUARD_S)
        assert wait_gone(tool), "the stage's trtllm-build is still running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(tool, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, (out, err)
    why = f"lease on {engine} lost: taken over by thief:7:cafe on elsewhere (pid 7)"
    assert why in err, err
    assert "this run was stopped and published nothing" in err
    assert engines(url) == []
    lease = lease_of(url, engine)
    assert (lease.owner, lease.status) == ("thief:7:cafe", "running")
    plan = json.loads(build(env, recipe, "--dry-run", "--json", "--only", SMALL_ENGINE).stdout)
    workdir = Path(next(s["workdir"] for s in plan["stages"] if s["key"] == engine))
    assert why in (workdir / "build.log").read_text()


def test_a_nightly_lease_taken_away_is_lost(registry_url: str) -> None:
    """The heartbeat of any lease (here the nightly's) calls `on_lost` once a renewal
    answers that the lease is someone else's, naming who holds it."""
    with open_registry(registry_url) as registry:
        with registry.session() as session:
            assert try_acquire_nightly(session, owner="me", host="h", pid=1, ttl_s=3.0)
        lost = threading.Event()
        reasons: list[str] = []

        def on_lost(reason: str) -> None:
            reasons.append(reason)
            lost.set()

        with Heartbeat(registry, NIGHTLY_KEY, owner="me", ttl_s=3.0, on_lost=on_lost) as beat:
            take_over(registry_url, NIGHTLY_KEY, owner="other", host="h2", pid=1)
            assert lost.wait(GUARD_S)
        assert beat.lost == reasons[0]
    assert reasons == [f"lease on {NIGHTLY_KEY} lost: taken over by other on h2 (pid 1)"]


def test_a_nightly_whose_lease_is_taken_away_stops(tmp_path: Path, registry_url: str) -> None:
    """A nightly rebuilding an engine (a driver bump) loses the nightly lease to another
    nightly: its tool is stopped, it exits 4 naming who took the lease, and its row in
    `nightly_runs` says so."""
    from tests.integration.nightly_box import NEW, Box

    box = Box(tmp_path, registry_url, max_regression=0.99)  # no numbers weighed here
    box.run("build", str(box.recipe))
    box.bump(NEW)
    pidfile = tmp_path / "trtllm-build.pid"
    env = {**box.env, "ENGINECTL_LEASE_TTL_S": "3", "FAKE_TRTLLM_HANG": "1",
           "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    proc = subprocess.Popen([ENGINECTL, "nightly", "--json"], env=env, cwd=box.cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    tool = wait_for_pidfile(proc, pidfile)
    try:
        take_over(registry_url, NIGHTLY_KEY, owner="other-nightly", host="elsewhere",
                  pid=proc.pid)
        out, err = proc.communicate(timeout=GUARD_S)
        assert wait_gone(tool), "the nightly's trtllm-build is still running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(tool, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    why = f"lease on {NIGHTLY_KEY} lost: taken over by other-nightly on elsewhere"
    assert proc.returncode == 4, (out, err)
    assert why in err.splitlines()[-1], err
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        # the model's columns: no registry function reads back a nightly that failed
        status, report = session.execute(select(NightlyRun.status, NightlyRun.report)
                                         .order_by(NightlyRun.id.desc()).limit(1)).one()
    assert status == "failed"
    assert why in (json.loads(report) if isinstance(report, str) else report)["error"]
