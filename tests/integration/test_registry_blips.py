"""A database blip shorter than the lease never fails a healthy build: PostgreSQL behind a
TCP proxy (tests/integration/tcp_proxy.py) that cuts every connection again and again, or
refuses connections for a while, under `enginectl build` on TensorRT-LLM's stand-ins. Every
registry call retries the fault (`registry.sql.resilient`); one that outlasts the lease
stops the stage and says which lease it lost. A pull and a nightly ride them out the same
way."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import builder_env
from tests.integration.builds import (
    GUARD_S,
    SMALL_ENGINE,
    build,
    counts,
    engine_key,
    engines,
    lease_of,
    start,
    wait_for_pidfile,
    write_recipe,
)
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.waits  # on blips and lease time-outs: spread (conftest)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with TcpProxy(5432) as made:
        yield made


@pytest.fixture
def env(tmp_path: Path, postgres_url: str, proxy: TcpProxy) -> dict[str, str]:
    """A builder whose registry is *postgres_url* through the proxy (migrated first, past
    it: the blips are the builder's)."""
    from registry.sql.db import open_registry

    open_registry(postgres_url).close()
    return builder_env(tmp_path, proxy.url(postgres_url))


def release(fifo: Path) -> None:
    """Let the stand-in trtllm-build waiting on *fifo* go on."""
    handle = os.open(fifo, os.O_WRONLY)
    try:
        os.write(handle, b"go")
    finally:
        os.close(handle)


def held_build(env: dict[str, str], tmp_path: Path,
               recipe: Path) -> tuple[subprocess.Popen[str], Path]:
    """A build of the small engine whose trtllm-build runs until the test releases it."""
    fifo, pidfile = tmp_path / "release-the-build", tmp_path / "trtllm-build.pid"
    os.mkfifo(fifo)
    proc = start({**env, "FAKE_TRTLLM_WAIT_FIFO": str(fifo),
                  "FAKE_TRTLLM_PIDFILE": str(pidfile)}, recipe, "--only", SMALL_ENGINE)
    wait_for_pidfile(proc, pidfile)
    return proc, fifo


def refused(proxy: TcpProxy, seconds: float, fifo: Path) -> None:
    """Refuse connections for *seconds*, and let trtllm-build end as it begins: the build
    then publishes, and releases its lease, while nothing answers."""
    refusing = threading.Thread(target=proxy.refuse, args=(seconds,))
    refusing.start()
    try:
        while proxy.refusing is False:
            threading.Event().wait(0.01)
    finally:
        release(fifo)
        refusing.join()


def test_a_build_rides_out_connections_cut_every_0_3_s(
    env: dict[str, str], tmp_path: Path, proxy: TcpProxy, postgres_url: str
) -> None:
    """Every connection is cut each 0.3 s for the whole build (a 6 s lease): it succeeds,
    with one engine and its lease finished."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": "6"}
    with proxy.cutting(every_s=0.3):
        done = build(env, recipe, "--only", SMALL_ENGINE)
    assert counts(done.stdout)["built"] == 3, done.stdout
    assert proxy.cuts > 0
    assert len(engines(postgres_url)) == 1


def test_a_build_rides_out_3_s_of_refused_connections(
    env: dict[str, str], tmp_path: Path, proxy: TcpProxy, postgres_url: str
) -> None:
    """Connections are cut and refused for 3 s while trtllm-build runs, and it ends then (a
    12 s lease): the publish, the heartbeat and the release wait, and the build succeeds."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": "12"}
    proc, fifo = held_build(env, tmp_path, recipe)
    refused(proxy, 3.0, fifo)
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, (out, err)
    assert counts(out)["built"] == 3
    assert len(engines(postgres_url)) == 1


def test_a_registry_refused_past_the_lease_stops_the_stage_naming_the_lease(
    env: dict[str, str], tmp_path: Path, proxy: TcpProxy, postgres_url: str
) -> None:
    """Connections refused for 15 s under a 6 s lease, as trtllm-build ends: the stage
    stops when the lease would expire, the build fails with exit 3 saying that the engine's
    lease was lost and why, and publishes no engine."""
    recipe = write_recipe(tmp_path)
    key = engine_key(env, recipe)
    env = {**env, "ENGINECTL_LEASE_TTL_S": "6"}
    proc, fifo = held_build(env, tmp_path, recipe)
    refused(proxy, 15.0, fifo)
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 3, (out, err)
    assert f"lease on {key} lost" in out + err, (out, err)
    assert "Traceback" not in err
    assert engines(postgres_url) == []
    assert lease_of(postgres_url, key).status != "succeeded"
    assert "no renewal reached the registry" in out + err


def test_two_builders_of_one_key_ride_out_cuts_every_1_5_s(
    env: dict[str, str], tmp_path: Path, proxy: TcpProxy, postgres_url: str
) -> None:
    """Two builders of the same engine, every connection cut each 1.5 s: both succeed, one
    builds it and the other reuses it."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": "6"}
    with proxy.cutting(every_s=1.5):
        first = start(env, recipe, "--only", SMALL_ENGINE)
        second = start(env, recipe, "--only", SMALL_ENGINE)
        outs = [proc.communicate(timeout=GUARD_S) for proc in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), outs
    built = sorted(counts(out)["built"] for out, _ in outs)
    assert built[0] < built[1], outs
    assert len(engines(postgres_url)) == 1


@pytest.fixture
def pulled(tmp_path: Path, postgres_url: str, proxy: TcpProxy) -> dict[str, str]:
    """A ready engine of model 'm' on H100, tagged m/prod (registered past the proxy), and a
    deploy node's environment whose registry is behind it."""
    from tests.integration.engines import make_engine

    env = {**builder_env(tmp_path, postgres_url), "ENGINECTL_CACHE_DIR": str(tmp_path / "cache")}
    engine = make_engine(tmp_path / "engine", tp=1)
    done = run_cli([ENGINECTL, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
                    "--gpu", "h100", "--ready", "--json"], env=env, timeout=GUARD_S)
    assert done.returncode == 0, done.stderr
    tagged = run_cli([ENGINECTL, "tag", json.loads(done.stdout)["digest"], "m/prod"], env=env,
                     timeout=GUARD_S)
    assert tagged.returncode == 0, tagged.stderr
    return {**env, "ENGINECTL_REGISTRY_URL": proxy.url(postgres_url)}


@pytest.mark.parametrize("ref", [["m/prod"], ["--model", "m", "--gpu", "h100",
                                              "--allow-unproven"]])
def test_a_pull_rides_out_3_s_of_refused_connections(
    pulled: dict[str, str], tmp_path: Path, proxy: TcpProxy, ref: list[str]
) -> None:
    """A deploy node's pull starts while the registry refuses connections for 3 s: it
    waits (by REF: the driver-only read; by model: the ORM's resolve) and places the
    engine."""
    refusing = threading.Thread(target=proxy.refuse, args=(3.0,))
    refusing.start()
    try:
        while not proxy.refusing:
            threading.Event().wait(0.01)
        done = run_cli([ENGINECTL, "pull", *ref, "-o", str(tmp_path / "out")], env=pulled,
                       timeout=GUARD_S)
    finally:
        refusing.join()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "rank0.engine").is_file()


def test_a_nightly_rides_out_connections_cut_every_0_7_s(
    tmp_path: Path, postgres_url: str, proxy: TcpProxy
) -> None:
    """After a driver bump, a nightly (its lease, probe, rebuild, smoke, gate, promotion and
    run record) with every connection cut each 0.7 s and a 6 s lease: it finishes, exit 0,
    the rebuilt engine promoted."""
    from tests.integration.nightly_box import ENGINE_TARGET, NEW, Box, target

    box = Box(tmp_path, postgres_url, max_regression=0.99)
    box.run("build", str(box.recipe))
    box.bump(NEW)
    with proxy.cutting(every_s=0.7):
        report = box.nightly(ENGINECTL_REGISTRY_URL=proxy.url(postgres_url),
                             ENGINECTL_LEASE_TTL_S="6")
    assert report["exit_code"] == 0, report
    assert target(report, ENGINE_TARGET)["verdict"] == "promoted"
    assert proxy.cuts > 0


@pytest.mark.parametrize("before", [True, False], ids=["lost-before", "lost-after"])
def test_a_commit_whose_answer_is_lost_is_written_once(
    postgres_url: str, proxy: TcpProxy, before: bool
) -> None:
    """The connection is cut as a COMMIT goes out (before it reaches the server, or after:
    its answer never comes back): the session still succeeds, and the write (a toolchain
    probe, a new row each time it runs) is there exactly once: the server was asked what
    became of the transaction before it ran again."""
    from registry.sql import build_inputs
    from registry.sql.db import open_registry

    open_registry(postgres_url).close()
    with open_registry(proxy.url(postgres_url)) as registry:
        with registry.session() as session:  # a pooled connection, for the cut to find
            build_inputs.toolchain_history(session, "host:a")
        proxy.cut_at(b"COMMIT", before=before)
        with registry.session() as session:
            build_inputs.record_toolchain(session, "host:a", "H100", {"driver": "1"}, "a")
        assert proxy.cuts > 0
        with registry.session(readonly=True) as session:
            assert len(build_inputs.toolchain_history(session, "host:a", limit=10)) == 1
