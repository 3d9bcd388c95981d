"""Lease times are the database's clock, and a lease whose holder is gone from this host (a
pid that no longer runs or names a younger process, a builder killed with `kill -9`) is
taken over at once, not after its TTL (`registry.sql.leases`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from registry.sql import leases
from registry.sql.db import open_registry
from registry.sql.leases import NIGHTLY_KEY, db_now, nightly_holder, try_acquire_nightly
from tests.cli_forkserver import run_cli
from tests.helpers import wait_gone
from tests.integration.builds import (
    ENGINECTL,
    GUARD_S,
    SMALL_ENGINE,
    counts,
    engine_key,
    engines,
    lease_of,
    start,
    wait_for_pidfile,
    write_recipe,
)

TEN_YEARS_S = 10 * 365 * 86400.0


def gone_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- the database's clock -----------------------------------------------------------------------


def test_lease_times_are_the_databases_own(postgres_url: str) -> None:
    """A lease's start and expiry are the database's time of the statement (PostgreSQL's
    now() of the transaction), not the builder's clock."""
    with open_registry(postgres_url) as registry, registry.session() as session:
        assert leases.try_acquire_lease(session, "k1:clock", owner="me", host="h", pid=1,
                                        ttl_s=90.0)
        server_now = db_now(session)
        lease = leases.get_stage_run(session, "k1:clock")
        assert lease is not None
        assert lease.started_at == server_now
        assert lease.lease_expires_at == server_now + timedelta(seconds=90)
        assert leases.renew_lease(session, "k1:clock", owner="me", ttl_s=30.0)
        renewed = leases.get_stage_run(session, "k1:clock")
        assert renewed is not None
        assert renewed.lease_expires_at == server_now + timedelta(seconds=30)
        assert nightly_holder(session) is None


# --- a holder gone from this host ---------------------------------------------------------------


def test_a_lease_whose_holder_is_gone_from_this_host_is_taken_over(registry_url: str) -> None:
    """A running lease far from expiry: kept while its holder on this host runs (or runs on
    another host), taken over at once when its pid is gone or names a process younger than
    the lease (pid reuse); of two takers, one wins. The nightly lease likewise."""
    here = socket.gethostname()
    dead = gone_pid()
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    with open_registry(registry_url) as registry, registry.session() as session:
        for key in ("k1:alive", "k1:elsewhere", "k1:gone", "k1:reused"):
            # k1:reused: the holder's pid runs again, as a process started after the lease
            pid = {"k1:alive": os.getppid(), "k1:reused": os.getpid()}.get(key, dead)
            assert leases.try_acquire_lease(
                session, key, owner=f"old-{key}", host="other" if key == "k1:elsewhere"
                else here, pid=pid, ttl_s=TEN_YEARS_S, now=t0)
        me = os.getpid()
        assert not leases.try_acquire_lease(session, "k1:alive", owner="new", host=here,
                                            pid=me, ttl_s=60, now=t0)
        assert not leases.try_acquire_lease(session, "k1:elsewhere", owner="new", host=here,
                                            pid=me, ttl_s=60, now=t0)
        assert leases.try_acquire_lease(session, "k1:gone", owner="new", host=here, pid=me,
                                        ttl_s=60, now=t0)
        assert not leases.try_acquire_lease(session, "k1:gone", owner="racer", host=here,
                                            pid=me + 1, ttl_s=60, now=t0)
        assert leases.try_acquire_lease(session, "k1:reused", owner="new", host=here,
                                        pid=os.getppid(), ttl_s=60,
                                        now=datetime.now(UTC) + timedelta(days=365 * 5))
        assert try_acquire_nightly(session, owner="old-nightly", host=here, pid=dead,
                                   ttl_s=TEN_YEARS_S)
        assert try_acquire_nightly(session, owner="new-nightly", host=here, pid=me, ttl_s=60)
        owners = {key: leases.get_stage_run(session, key) for key in
                  ("k1:alive", "k1:elsewhere", "k1:gone", "k1:reused", NIGHTLY_KEY)}
    assert {key: found.owner for key, found in owners.items() if found} == {
        "k1:alive": "old-k1:alive", "k1:elsewhere": "old-k1:elsewhere", "k1:gone": "new",
        "k1:reused": "new", NIGHTLY_KEY: "new-nightly"}


def test_a_build_proceeds_at_once_past_a_gone_holders_lease(
    any_env: dict[str, str], tmp_path: Path
) -> None:
    """The engine's row says `running` for ten more years, held from this host by a pid that
    has exited: a build of that key takes it over at once and builds the engine."""
    url = any_env["ENGINECTL_REGISTRY_URL"]
    recipe = write_recipe(tmp_path)
    engine = engine_key(any_env, recipe)
    dead = gone_pid()
    with open_registry(url) as registry, registry.session() as session:
        assert leases.try_acquire_lease(session, engine, owner=f"{socket.gethostname()}:{dead}"
                                        ":0ld", host=socket.gethostname(), pid=dead,
                                        ttl_s=TEN_YEARS_S)
    done = run_cli([ENGINECTL, "build", str(recipe), "--only", SMALL_ENGINE], env=any_env,
                   timeout=GUARD_S)
    assert done.returncode == 0, done.stderr
    assert counts(done.stdout)["built"] == 3
    lease = lease_of(url, engine)
    assert lease.status == "succeeded"
    assert lease.pid != dead
    assert len(engines(url)) == 1


def test_a_build_killed_with_sigkill_is_run_again_at_once(
    any_env: dict[str, str], tmp_path: Path
) -> None:
    """`kill -9` of a builder during its engine build (lease TTL an hour), then the same
    build again: it takes the dead builder's lease over at once and builds the engine."""
    env = {**any_env, "ENGINECTL_LEASE_TTL_S": "3600"}
    url = env["ENGINECTL_REGISTRY_URL"]
    recipe = write_recipe(tmp_path)
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    first = start(hanging, recipe, "--only", SMALL_ENGINE)
    tool = wait_for_pidfile(first, pidfile)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    try:
        assert wait_gone(tool)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(tool, signal.SIGKILL)
    done = run_cli([ENGINECTL, "build", str(recipe), "--only", SMALL_ENGINE], env=env,
                   timeout=GUARD_S)
    assert done.returncode == 0, done.stderr
    assert counts(done.stdout) == {"built": 1, "reused": 2, "failed": 0, "skipped": 0}
    assert len(engines(url)) == 1
