"""`enginectl build --executor ray` when things go wrong on a real local Ray cluster
(tests/ray/conftest.py): a SKU no node has, a frozen stage past its timeout, Ctrl-C, a node lost
mid-build, `fleet` before and after probing, a cluster that does not answer. Split from
test_fleet_build.py so that the two run on two xdist workers, each with its own cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.helpers import without_store_note
from tests.ray.fleet import (
    H100,
    ONE_H100,
    PG,
    FakeCluster,
    FakeNode,
    enginectl,
    fleet_recipe,
    kill_tool,
    stage_rows,
    start,
)

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-2")  # its cluster: conftest.py
TIMEOUT_S = 20
"""The frozen engine build's timeout: long enough for a busy node to fetch its checkpoint and
start trtllm-build, which the test waits for before it freezes the worker."""


@PG
def test_a_sku_no_node_has_fails_preflight_with_exit_2_and_keep_going_skips_it(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    recipe = fleet_recipe(tmp_path, **{**ONE_H100, "gpu": ["h100", "b200"]})
    done = enginectl(fleet_env, "build", str(recipe), "--executor", "ray", code=2, timeout=60)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("enginectl: error: no node advertises gpu:B200-180GB, which 1 "
                           "target needs (B200-180GB/tp1/pp1/bf16/"), line
    pools = "H100-SXM5-80GB (2 nodes, 4 GPUs), L40S (1 nodes, 1 GPUs), CPU (1 nodes)"
    assert f"the cluster has: {pools}" in line
    assert "--keep-going" in line
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        assert list_artifacts(session) == []  # nothing was submitted
    kept = enginectl(fleet_env, "build", str(recipe), "--executor", "ray", "--keep-going",
                     "--dry-run", "--json")
    assert ("enginectl: note: skipping the targets no node can run: no node advertises "
            "gpu:B200-180GB") in kept.stderr


@PG
def test_a_stage_past_its_timeout_is_cancelled_by_the_driver_and_reported(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    """The worker is frozen mid-build (SIGSTOP: a wedged machine), so only the driver can
    end the stage: it cancels, then kills the task, and records the run cancelled.

    `build.timeout_s` bounds the snapshot and convert stages too, and a busy machine once
    took 32 s over the snapshot (CI, stop 30), so a build of another shape makes them first:
    the timed build reuses them, and its timeout falls on its engine build alone."""
    recipe = fleet_recipe(tmp_path, **ONE_H100)  # the model is random: written once
    settings = yaml.safe_load(recipe.read_text())
    shape = settings["matrix"]["shape"][0]
    settings["matrix"]["shape"] = [{**shape, "max_batch_size": 2}]  # its own engine
    recipe.write_text(yaml.safe_dump(settings))
    first = json.loads(enginectl(fleet_env, "build", str(recipe), "--executor", "ray",
                                 "--json").stdout)
    assert first["built"] == 4  # snapshot, convert, an engine and its smoke
    settings["matrix"]["shape"] = [shape]
    settings["build"] = {"timeout_s": TIMEOUT_S}
    recipe.write_text(yaml.safe_dump(settings))
    env = {**fleet_env, "ENGINECTL_RAY_TIMEOUT_GRACE_S": "0",
           "ENGINECTL_RAY_CANCEL_GRACE_S": "2"}
    h100 = [ray_cluster.nodes["h100-a"], ray_cluster.nodes["h100-b"]]
    for node in h100:
        node.hang_builds(True)
    proc = start(env, "build", str(recipe), "--executor", "ray", "--json")
    worker = None
    try:
        pidfile = _first_pidfile(h100, proc)
        tool = int(pidfile.read_text())
        worker = int(Path(f"/proc/{tool}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(worker, signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        for node in h100:
            node.hang_builds(False)
            kill_tool(node.tool_pidfile)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, (out, err)
    (line,) = without_store_note(err).strip().splitlines()
    assert line.startswith("enginectl: error: build "), line
    assert f"timed out after {TIMEOUT_S} s on " in line
    assert "cancelled by the driver" in line
    summary = json.loads(out)
    assert {s["stage"]: s["status"] for s in summary["stages"]}.items() >= {
        "snapshot": "reused", "convert": "reused", "build": "cancelled"}.items()
    (cancelled,) = [s for s in summary["stages"] if s["status"] == "cancelled"]
    assert summary["cancelled"] == 1
    row = stage_rows(fleet_env, [cancelled["key"]])[cancelled["key"]]
    assert row is not None
    assert row.status == "cancelled"  # type: ignore[attr-defined]
    assert f"timed out after {TIMEOUT_S} s" in row.error  # type: ignore[attr-defined]
    assert worker is not None
    assert _gone(worker), "the frozen worker was not killed"


def _gone(pid: int) -> bool:
    """*pid* has exited (a zombie its raylet has not reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@PG
def test_ctrl_c_cancels_every_task_releases_the_leases_and_exits_130(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    recipe = fleet_recipe(tmp_path, **ONE_H100)
    with _hung_build(fleet_env, recipe, ray_cluster) as (proc, pidfile):
        tool = int(pidfile.read_text())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    last = err.strip().splitlines()[-1]  # what was kept, and that a re-run resumes
    assert last.startswith("enginectl: error: interrupted: cancelled build "), last
    assert "rerun `enginectl build" in last
    assert _gone(tool)  # the worker stopped its tool before the driver exited
    plan = json.loads(enginectl(fleet_env, "plan", str(recipe), "--executor", "ray",
                                "--json").stdout)
    engine = next(s for s in plan["stages"] if s["kind"] == "trtllm-engine")
    row = stage_rows(fleet_env, [engine["key"]])[engine["key"]]
    assert row is not None
    assert row.status == "cancelled"  # type: ignore[attr-defined]
    resumed = json.loads(enginectl(fleet_env, "build", str(recipe), "--executor", "ray",
                                   "--json").stdout)
    assert resumed["built"] == 2  # the engine and its smoke: upstream was kept
    assert resumed["reused"] == 2


@PG
def test_a_node_lost_mid_build_is_retried_on_the_other_node_of_its_pool(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    recipe = fleet_recipe(tmp_path, **ONE_H100)
    with _hung_build(fleet_env, recipe, ray_cluster) as (proc, pidfile):
        h100 = [ray_cluster.nodes["h100-a"], ray_cluster.nodes["h100-b"]]
        lost = next(n for n in h100 if n.tool_pidfile == pidfile)
        survivor = next(n for n in h100 if n is not lost)
        for node in h100:
            node.hang_builds(False)
        try:
            ray_cluster.kill(lost.name)
            kill_tool(pidfile)  # the stand-in outlives its killed worker; a machine would not
            out, err = proc.communicate(timeout=300)
        finally:
            if lost.name not in ray_cluster.nodes:
                ray_cluster.add(lost.name)  # the next tests get a whole cluster
    assert proc.returncode == 0, (out, err)
    summary = json.loads(out)
    engine = next(s for s in summary["stages"] if s["stage"] == "build")
    assert engine["status"] == "built"
    assert engine["node"]["node_id"] == survivor.node_id
    row = stage_rows(fleet_env, [engine["key"]])[engine["key"]]
    assert row is not None
    assert row.node_id == survivor.node_id  # type: ignore[attr-defined]
    assert row.status == "succeeded"  # type: ignore[attr-defined]


@contextlib.contextmanager
def _hung_build(env: dict[str, str], recipe: Path, cluster: FakeCluster
                ) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A Ray build of *recipe* whose trtllm-build hangs on both H100 nodes, and the pidfile of
    the first one that started; the hang is lifted and the build killed when the block ends."""
    h100 = [cluster.nodes["h100-a"], cluster.nodes["h100-b"]]
    for node in h100:
        node.hang_builds(True)
    proc = start(env, "build", str(recipe), "--executor", "ray", "--json")
    try:
        yield proc, _first_pidfile(h100, proc)
    finally:
        for node in h100:
            node.hang_builds(False)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _first_pidfile(nodes: list[FakeNode], proc: subprocess.Popen[str]) -> Path:
    """The pidfile of the first node whose trtllm-build started (and hangs)."""
    deadline = time.monotonic() + 300
    while True:
        for node in nodes:
            if node.tool_pidfile.exists() and node.tool_pidfile.read_text().strip():
                return node.tool_pidfile
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the build exited {proc.returncode} early: {out[-2000:]} {err}")
        assert time.monotonic() < deadline, "no trtllm-build started"
        time.sleep(0.1)


@PG
def test_fleet_lists_pools_nodes_gpus_and_the_last_probe(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    before = json.loads(enginectl(fleet_env, "fleet", "--json").stdout)
    pools = {p["pool"]: p for p in before["pools"]}
    assert set(pools) == {H100, "L40S"}
    assert (pools[H100]["gpus_total"], pools[H100]["gpus_free"]) == (4, 4)
    assert {n["node_id"] for n in pools[H100]["nodes"]} == {
        ray_cluster.nodes["h100-a"].node_id, ray_cluster.nodes["h100-b"].node_id}
    assert pools[H100]["resource"] == "gpu:H100-SXM5-80GB"
    assert pools[H100]["last_probe"] is None
    assert [n["node_id"] for n in before["cpu_nodes"]] == [ray_cluster.nodes["head"].node_id]
    assert before["versions"]["ray"] == "2.60.0"
    recipe = fleet_recipe(tmp_path, **ONE_H100)
    enginectl(fleet_env, "build", str(recipe), "--executor", "ray", "--dry-run")
    after = json.loads(enginectl(fleet_env, "fleet", "--json").stdout)
    probe = next(p for p in after["pools"] if p["pool"] == H100)["last_probe"]
    assert probe["toolchain"]["driver"] == "570.124.06"
    assert probe["toolchain"]["gpu"] == H100
    text = enginectl(fleet_env, "fleet").stdout
    assert f"  {H100:<16} 2 nodes, GPUs 4/4 free; probed " in text
    assert "driver 570.124.06" in text


def test_an_unreachable_cluster_is_one_line_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ENGINECTL_"))}
    env |= {"ENGINECTL_HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0"}
    recipe = fleet_recipe(tmp_path, **ONE_H100)
    for args in (["fleet", "--address", "127.0.0.1:1"],
                 ["build", str(recipe), "--executor", "ray", "--address", "ray://127.0.0.1:1"]):
        done = enginectl(env, *args, code=2, timeout=120)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("enginectl: error: cannot join the Ray cluster at "), line
        assert "nothing answers at 127.0.0.1:1" in line
        assert "--address" in line
