"""`enginectl nightly --executor ray` on the session's real local Ray cluster: the pools are
the cluster's, probed on their nodes; a driver bump on the L40S node rebuilds and re-proves the
L40S engine alone, and moves its alias."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from registry.sql.alias_records import get_alias
from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.ray.fleet import DRIVER, FakeCluster, enginectl, fleet_recipe

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-2")  # its cluster: conftest.py


NEW = "575.57.08"


def nightly(env: dict[str, str], *args: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(
        enginectl(env, "nightly", "--executor", "ray", "--json", *args).stdout)
    return report


@pytest.mark.parametrize("fleet_env", [("file", "postgresql")], indirect=True,
                         ids=["file-postgresql"])
def test_a_driver_bump_on_one_pool_requalifies_that_pool_alone(
        fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster) -> None:
    # no gate or alarm numbers are weighed here: the alarm compares this run's re-proof with
    # the build's proof, measured in another run, and a loaded machine's stalls can cost a
    # tiny stand-in request 10x (it failed CI at 0.9); tests/integration tests the alarm
    recipe = fleet_recipe(tmp_path, include=[], promote=[
        {"alias": "tiny-fleet/{gpu}/{tp}", "max_regression": 0.99}],
        nightly={"max_regression": 0.99})
    enginectl(fleet_env, "build", str(recipe), "--executor", "ray")
    assert nightly(fleet_env)["nothing_changed"]
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        old = get_alias(session, "tiny-fleet/l40s/tp1")
        h100 = get_alias(session, "tiny-fleet/h100-sxm5-80gb/tp1")
    ray_cluster.nodes["l40s"].set_driver(NEW)
    try:
        report = nightly(fleet_env)
    finally:
        ray_cluster.nodes["l40s"].set_driver(DRIVER)
    assert report["exit_code"] == 0, report["failures"]
    changes = {p["pool"]: p["changes"] for p in report["pools"]}
    assert changes["L40S"] == [  # the CUDA the driver runs moves with its branch
        {"field": "driver", "old": DRIVER, "new": NEW},
        {"field": "driver_cuda", "old": "12.8", "new": "12.9"}]
    assert changes["H100-SXM5-80GB"] == []
    [target] = [t for r in report["recipes"] for t in r["targets"]
                if t["verdict"] != "unchanged"]  # the H100 pool's target is listed unchanged
    assert target["id"].startswith("L40S/")
    assert [s["stage"] for s in target["stages"]] == ["build", "smoke"]
    assert target["stages"][0]["because"] == [f"driver {DRIVER} → {NEW}"]
    assert target["promotions"][0]["action"] == "promoted"
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        assert get_alias(session, "tiny-fleet/h100-sxm5-80gb/tp1") == h100
        new = get_alias(session, "tiny-fleet/l40s/tp1")
        assert new not in (None, old)
        statuses = {e.digest: e.status for e in list_artifacts(session, gpu="L40S")}
        assert statuses == {old: "superseded", new: "ready"}
