"""`enginectl build --executor ray` on a real local Ray cluster (tests/ray/conftest.py): every
stage on a node of its pool, every key once, a pool mid driver upgrade, two drivers at once
(what happens when nodes, pools or stages go wrong: test_fleet_faults.py). The CLI runs as a
user runs it; TRT-LLM's programs are the stand-ins in tests/fakes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.sql.build_inputs import toolchain_history
from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.ray.fleet import (
    DRIVER,
    H100,
    ONE_H100,
    PG,
    SECRET,
    FakeCluster,
    enginectl,
    fleet_recipe,
    stage_rows,
    start,
)

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-1")  # its cluster: conftest.py


def test_a_fleet_recipe_builds_each_stage_on_its_pool_then_reuses_everything(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    recipe = fleet_recipe(tmp_path)
    done = enginectl(fleet_env, "build", str(recipe), "--executor", "ray", "--json")
    summary = json.loads(done.stdout)
    # snapshot, 2 converts (tp 1 shared by L40S and H100, tp 2), 3 engines, 3 engine smokes,
    # the CPU vLLM entry; its smoke awaits vLLM, which no node has
    assert (summary["built"], summary["reused"], summary["failed"]) == (10, 0, 0), summary
    assert summary["pending_smoke"] == 1
    nodes = ray_cluster.nodes
    pools = {"H100-SXM5-80GB": {nodes["h100-a"].node_id, nodes["h100-b"].node_id},
             "L40S": {nodes["l40s"].node_id}, "CPU": {nodes["head"].node_id}}
    rows = stage_rows(fleet_env, [s["key"] for s in summary["stages"]])
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        kinds = {a.key: a.kind for a in list_artifacts(session)}
    for stage in summary["stages"]:
        gpu = stage["targets"][0].split("/")[0]  # the target's SKU, or CPU
        node = stage["node"]["node_id"]
        on_gpu = stage["stage"] in ("convert", "smoke") or kinds[stage["key"]] == "trtllm-engine"
        where = gpu if on_gpu else "CPU"  # snapshot and no-build entries: the CPU node
        assert node in pools[where], (stage["stage"], stage["targets"], where)
        if stage["status"] != "pending-smoke":  # what ran took its lease there
            row = rows[stage["key"]]
            assert row is not None
            assert row.node_id == node, stage  # type: ignore[attr-defined]
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        engines = list_artifacts(session, kind="trtllm-engine")
        assert sorted(e.gpu or "" for e in engines) == ["H100-SXM5-80GB"] * 2 + ["L40S"]
        assert {e.status for e in engines} == {"ready"}
        probes = toolchain_history(session, H100, limit=10)
        assert {p.node_id for p in probes} == pools[H100]
        assert {p.fingerprint["driver"] for p in probes} == {"570.124.06"}
        assert toolchain_history(session, "L40S")[0].node_id == nodes["l40s"].node_id
    engine = next(e for e in engines if e.gpu == "L40S")
    assert engine.toolchain["gpu"] == "L40S"
    assert engine.toolchain["driver"] == "570.124.06"
    shown = enginectl(fleet_env, "show", engine.digest).stdout
    assert f"(Ray node {nodes['l40s'].node_id})" in shown

    for row in rows.values():  # credentials travel to the workers, never into a row
        assert SECRET not in repr(row)
    assert SECRET not in done.stdout + done.stderr + shown

    on_ray = {**fleet_env, "ENGINECTL_EXECUTOR": "ray"}  # the variable, not the option
    again = json.loads(enginectl(on_ray, "build", str(recipe), "--json").stdout)
    assert (again["built"], again["reused"], again["failed"]) == (0, 10, 0), again

    plan = json.loads(enginectl(fleet_env, "plan", str(recipe), "--executor", "ray",
                                "--json").stdout)
    assert {s["key"] for s in plan["stages"]} == {s["key"] for s in summary["stages"]}
    assert all(s["built"] for s in plan["stages"] if s["kind"] == "trtllm-engine")


UPGRADED = "575.51.03"


@PG
def test_a_pool_mid_driver_upgrade_builds_and_smokes_each_group_on_its_own_nodes(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    """Half the H100 pool has the new driver (a rolling upgrade): each group of nodes that
    agree keys the engine and its smoke with its own driver, builds and smokes them on its
    own nodes; what no driver changes (snapshot, convert) is built once. `plan --executor
    ray` predicts those keys from the recorded probing, and `fleet` shows the groups."""
    recipe = fleet_recipe(tmp_path, **ONE_H100)
    old, new = ray_cluster.nodes["h100-a"], ray_cluster.nodes["h100-b"]
    new.set_driver(UPGRADED)
    try:
        done = enginectl(fleet_env, "build", str(recipe), "--executor", "ray", "--json")
        planned = json.loads(enginectl(fleet_env, "plan", str(recipe), "--executor", "ray",
                                       "--json").stdout)
        text = enginectl(fleet_env, "plan", str(recipe), "--executor", "ray").stdout
        fleet = json.loads(enginectl(fleet_env, "fleet", "--json").stdout)
        fleet_text = enginectl(fleet_env, "fleet").stdout
    finally:
        new.set_driver(DRIVER)
    split = f"pool {H100} is split (driver {DRIVER}"
    assert split in done.stderr, done.stderr
    summary = json.loads(done.stdout)
    # snapshot, convert; per group an engine and its smoke
    assert (summary["built"], summary["reused"], summary["failed"]) == (6, 0, 0), summary
    runs = {s["key"]: s for s in planned["stages"]}
    assert set(runs) == {s["key"] for s in summary["stages"]}  # plan predicts every key
    assert all(s["built"] for s in planned["stages"])
    by_driver = {DRIVER: old.node_id, UPGRADED: new.node_id}
    for stage in summary["stages"]:
        driver = runs[stage["key"]]["toolchain"].get("driver")
        if stage["stage"] in ("build", "smoke"):
            assert stage["node"]["node_id"] == by_driver[driver], (stage, driver)
        else:
            assert driver is None
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        engines = list_artifacts(session, kind="trtllm-engine")
    assert sorted(e.toolchain["driver"] for e in engines) == [DRIVER, UPGRADED]
    assert {e.status for e in engines} == {"ready"}  # each smoked on its own group
    assert f"pool {H100} is split into 2 groups:" in text
    (pool,) = [p for p in fleet["pools"] if p["pool"] == H100]
    groups = pool["last_probe"]["groups"]
    assert [(g["nodes"], g["toolchain"]["driver"]) for g in groups] in (
        [([old.node_id], DRIVER), ([new.node_id], UPGRADED)],
        [([new.node_id], UPGRADED), ([old.node_id], DRIVER)])
    assert "split into 2 groups" in fleet_text
    assert f"driver {UPGRADED}" in fleet_text


@PG
def test_two_drivers_building_one_recipe_build_each_key_once(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    recipe = fleet_recipe(tmp_path)
    procs = [start(fleet_env, "build", str(recipe), "--executor", "ray", "--json")
             for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    summaries = [json.loads(out) for out, _ in outputs]
    built = [{s["key"] for s in summary["stages"] if s["status"] == "built"}
             for summary in summaries]
    assert not built[0] & built[1], "a key was built twice"
    assert len(built[0] | built[1]) == 10
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        assert len(list_artifacts(session)) == 7  # snapshot, 2 converts, 3 engines, 1 entry
