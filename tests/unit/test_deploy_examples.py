"""deploy/ holds the cluster examples a team starts from; their resource names must be the
ones enginectl's planner asks Ray for, or every task would wait for a resource no node has."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from pipeline.executors.pools import CPU_POOL, placement, resource
from pipeline.plan import plan_recipe
from pipeline.recipe import load_recipe
from pipeline.settings import Settings
from registry.gpus import lookup_gpu

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _asked(recipe: Path) -> dict[str, int]:
    """The gpu:<SKU> resources the planner asks for, with the most units one run needs."""
    plan = plan_recipe(load_recipe(recipe), Settings.from_env({"ENGINECTL_HOME": "/nowhere"}))
    asked: dict[str, int] = {}
    for run in plan.stages.values():
        where = placement(plan, run)
        if where.pool != CPU_POOL:
            name = resource(where.pool)
            assert set(where.resources) == {name}
            asked[name] = max(asked.get(name, 0), where.num_gpus)
    return asked


def _raycluster_pools() -> dict[str, int]:
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    assert cluster["kind"] == "RayCluster"
    assert "resources" not in cluster["spec"]["headGroupSpec"]["rayStartParams"]  # CPU pool
    pools: dict[str, int] = {}
    for group in cluster["spec"]["workerGroupSpecs"]:
        params = group["rayStartParams"]
        # KubeRay passes the value to `ray start --resources` as a quoted JSON string
        advertised = json.loads(json.loads(params["resources"]))
        ((name, units),) = advertised.items()
        sku = name.removeprefix("gpu:")
        assert lookup_gpu(sku).sku == sku, f"{name} is not spelled as the catalog spells it"
        spec = group["template"]["spec"]
        product = spec["nodeSelector"]["nvidia.com/gpu.product"]
        assert lookup_gpu(product).sku == sku, (group["groupName"], product)
        (container,) = spec["containers"]
        assert int(params["num-gpus"]) == units
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == units
        assert container["image"].endswith("enginectl-builder:1.2.1")
        pools[name] = units
    return pools


def _bare_metal_pools() -> dict[str, int]:
    text = (DEPLOY / "bare-metal" / "ray-start.sh").read_text()
    pools: dict[str, int] = {}
    for gpus, resources in re.findall(r"--num-gpus (\d+) --resources '(\{[^']*\})'", text):
        ((name, units),) = json.loads(resources).items()
        assert lookup_gpu(name.removeprefix("gpu:")).sku == name.removeprefix("gpu:")
        assert int(gpus) == units
        pools[name] = units
    return pools


def test_the_raycluster_and_ray_start_lines_advertise_what_the_fleet_recipe_asks_for() -> None:
    asked = _asked(ROOT / "recipes" / "llama8b-fleet.yaml")
    assert set(asked) == {"gpu:A100-SXM4-80GB", "gpu:L40S", "gpu:H100-SXM5-80GB"}
    for pools in (_raycluster_pools(), _bare_metal_pools()):
        assert set(pools) == set(asked)
        for name, units in asked.items():
            assert units <= pools[name], f"a run asks {units} {name}, a node has {pools[name]}"


def test_the_rayjob_builds_a_shipped_recipe_on_that_cluster() -> None:
    job = yaml.safe_load((DEPLOY / "kuberay" / "rayjob-build.yaml").read_text())
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    assert job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    argv = job["spec"]["entrypoint"].split()
    assert argv[:2] == ["enginectl", "build"]
    assert argv[argv.index("--executor") + 1] == "ray"
    recipe = Path(argv[2])
    assert recipe.parts[:3] == ("/", "opt", "enginectl")  # the builder image's WORKDIR
    assert (ROOT / Path(*recipe.parts[3:])).is_file()
