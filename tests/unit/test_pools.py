"""Pools, placement and preflight on a Ray cluster: pure decisions, table tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.executors.groups import (
    Group,
    NodeProbe,
    disagreement,
    group_lines,
    groups_of,
    plan_groups,
    pool_toolchain,
)
from pipeline.executors.pools import (
    CPU_POOL,
    PIN,
    NodeInfo,
    fleet_of,
    missing,
    missing_message,
    nodes_from_ray,
    placement,
    stage_timeout,
)
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.planning.toolchain import Toolchain
from pipeline.recipe.reader import load_recipe
from pipeline.settings import Settings
from tests.integration.builds import make_model

H100 = "H100-SXM5-80GB"


def node(name: str, **resources: float) -> NodeInfo:
    return NodeInfo(f"{name:0<56}", name, "10.0.0.1", {"CPU": 8.0, **resources})


def test_pools_are_nodes_by_catalog_sku_and_a_resource_spelled_otherwise_is_named() -> None:
    nodes = [node("a", **{f"gpu:{H100}": 8, "GPU": 8}), node("b", **{"gpu:h100": 8}),
             node("c")]
    fleet = fleet_of(nodes)
    assert list(fleet.pools) == [H100]
    assert fleet.pools[H100].gpus == 8
    assert [n.host for n in fleet.cpu.nodes] == ["c"]
    assert fleet.cpu_only
    assert list(fleet.unknown) == ["gpu:h100"]
    assert fleet.names() == f"{H100} (1 nodes, 8 GPUs), CPU (1 nodes)"
    only_gpus = fleet_of(nodes[:1])
    assert not only_gpus.cpu_only  # CPU work then goes anywhere
    assert only_gpus.cpu.nodes == tuple(nodes[:1])


def test_dead_nodes_are_not_part_of_the_fleet() -> None:
    entries = [{"NodeID": "n1", "Alive": True, "NodeManagerHostname": "h1",
                "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4}},
               {"NodeID": "n2", "Alive": False, "NodeManagerHostname": "h2",
                "NodeManagerAddress": "10.0.0.2", "Resources": {f"gpu:{H100}": 8}}]
    assert [n.node_id for n in nodes_from_ray(entries)] == ["n1"]


@pytest.fixture
def plan(tmp_path: Path):  # type: ignore[no-untyped-def]
    make_model(tmp_path / "model")
    recipe = {"model": {"name": "toy", "source": "./model"},
              "matrix": {"gpu": ["h100", "l40s", "cpu"], "tp": [1, 2], "quant": ["bf16"],
                         "shape": [{"max_batch_size": 2, "max_input_len": 64,
                                    "max_seq_len": 128}],
                         "exclude": [{"gpu": "cpu", "runtime": "trtllm"},
                                     {"gpu": "cpu", "tp": 2}]},
              "serve": {"trtllm": {}, "vllm": {}},
              "build": {"timeout_s": 600}, "quantize": {"timeout_s": 900},
              "smoke": {"concurrency": [1, 4], "requests": 8, "ready_timeout_s": 60,
                        "request_timeout_s": 10}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return plan_recipe(load_recipe(path), Settings.from_env({"ENGINECTL_HOME": str(tmp_path)}))


def test_each_stage_asks_for_its_pool_and_gpus(plan) -> None:  # type: ignore[no-untyped-def]
    seen = set()
    for run in plan.stages.values():
        target = plan.target(run.targets[0])
        where = placement(plan, run)
        ranks = target.tp * target.pp
        if run.stage == "build" and run.kind == "trtllm-engine":
            assert (where.pool, where.num_gpus) == (target.gpu.sku, ranks)
            assert where.resources == {f"gpu:{target.gpu.sku}": float(ranks)}
        elif run.stage == "smoke" and not target.gpu.is_cpu:
            assert (where.pool, where.num_gpus) == (target.gpu.sku, ranks)
        elif run.stage == "convert":
            assert (where.pool, where.num_gpus) == (target.gpu.sku, 0)
            assert where.resources == {f"gpu:{target.gpu.sku}": PIN}
        else:  # snapshot, no-build entries, the CPU target's smoke
            assert (where.pool, where.num_gpus, dict(where.resources)) == (CPU_POOL, 0, {})
        seen.add((run.stage, where.pool))
    assert ("snapshot", CPU_POOL) in seen
    assert ("smoke", CPU_POOL) in seen
    assert ("build", "L40S") in seen


def test_stage_timeouts_come_from_the_recipe(plan) -> None:  # type: ignore[no-untyped-def]
    recipe = plan.loaded.recipe
    by_stage = {run.stage: stage_timeout(recipe, run) for run in plan.stages.values()}
    assert by_stage["build"] == by_stage["convert"] == by_stage["snapshot"] == 600
    assert by_stage["smoke"] == 60 + 10 * (5 + 8 + 2)  # ready, 5 checks, load at c=1 and c=4


def test_missing_skus_name_the_targets_and_the_pools_there_are(plan) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_of([node("a", **{f"gpu:{H100}": 8}), node("c")])
    gaps = missing(plan, fleet)
    assert list(gaps) == ["L40S"]
    assert all(t.startswith("L40S/") for t in gaps["L40S"])
    message = missing_message(gaps, fleet, skipped=False)
    assert message.startswith(f"no node advertises gpu:L40S, which {len(gaps['L40S'])} "
                              "targets need (L40S/tp1/")
    assert f"the cluster has: {H100} (1 nodes, 8 GPUs), CPU (1 nodes)" in message
    assert "--keep-going" in message
    assert missing_message(gaps, fleet, skipped=True).startswith(
        "skipping the targets no node can run: no node advertises gpu:L40S")


def probe(name: str, seen: str = "NVIDIA H100 80GB HBM3", **fields: object) -> NodeProbe:
    values = {"gpu": H100, "sm": 90, "driver": "570.124.06", "cuda": "12.8", "trtllm": "1.2.1",
              **fields}
    return NodeProbe(node(name), Toolchain(**values), seen, 8)  # type: ignore[arg-type]


def cpu_probe(name: str, **fields: object) -> NodeProbe:
    values = {"trtllm": "1.2.1", "vllm": "0.32.0", **fields}
    return NodeProbe(node(name), Toolchain(**values), None, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("pool", "probes", "expected"), [
    (H100, [probe("a"), probe("b")], None),
    (H100, [probe("a"), probe("b", driver="575.51.03"), probe("c")], None),  # groups
    (H100, [probe("a"), probe("b", "NVIDIA L40S", gpu="L40S", sm=89)],
     "advertises gpu:H100-SXM5-80GB but its nvidia-smi reports 'NVIDIA L40S'"),
    (CPU_POOL, [cpu_probe("a"), cpu_probe("b", vllm="0.31.0"), cpu_probe("c")],
     "pool CPU: its 3 nodes disagree (vllm 0.31.0 on 1 node, 0.32.0 on 2 nodes)"),
])
def test_a_wrong_gpu_or_cpu_nodes_that_disagree_are_refused_with_counts(
    pool: str, probes: list[NodeProbe], expected: str | None
) -> None:
    found = disagreement(pool, probes)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert expected in found


def test_gpu_nodes_that_differ_are_groups_the_largest_first() -> None:
    probes = [probe("a"), probe("b", driver="575.51.03"), probe("c"),
              probe("d", driver="575.51.03", trtllm="1.3.0")]
    groups = groups_of(H100, [(p.toolchain, p.node.node_id, p.node.host) for p in probes])
    assert [g.hosts for g in groups] == [("a", "c"), ("b",), ("d",)]
    assert [g.toolchain.driver for g in groups] == ["570.124.06", "575.51.03", "575.51.03"]
    assert group_lines(groups) == [
        "driver 570.124.06, trtllm 1.2.1 on 2 nodes (a, c)",
        "driver 575.51.03, trtllm 1.2.1 on 1 node (b)",
        "driver 575.51.03, trtllm 1.3.0 on 1 node (d)"]
    (one,) = groups_of(H100, [(p.toolchain, p.node.node_id, p.node.host)
                              for p in probes[:1] + probes[2:3]])
    assert one.nodes == (node("a").node_id, node("c").node_id)


def test_a_split_pool_plans_its_targets_once_per_group_on_that_groups_nodes(plan: Plan) -> None:
    old, new = (Toolchain(driver=d, cuda="12.8", trtllm="1.2.1", tensorrt="10.14.1",
                          modelopt="0.37.0", torch="2.9.1", transformers="4.57.3",
                          vllm="0.32.0") for d in ("570.124.06", "575.51.03"))
    a, b, c = node("a").node_id, node("b").node_id, node("c").node_id
    h100 = [(Group(H100, old, (a, c), ("a", "c")), old), (Group(H100, new, (b,), ("b",)), new)]
    l40s = [(Group("L40S", old, ("l",), ("l",)), old)]
    whole = plan_groups(plan.loaded, Settings.from_env({"ENGINECTL_HOME": "/tmp/x"}), old,
                        {H100: h100[:1], "L40S": l40s})
    split = plan_groups(plan.loaded, Settings.from_env({"ENGINECTL_HOME": "/tmp/x"}), old,
                        {H100: h100, "L40S": l40s})
    assert whole.nodes == {}  # one group per pool: placement as ever
    assert set(whole.plan.stages) < set(split.plan.stages)
    added = set(split.plan.stages) - set(whole.plan.stages)
    # each H100 target's engine (or entry) and smoke again, keyed with the new driver
    h100_targets = [t for t in whole.plan.targets if t.target.gpu.sku == H100]
    assert {split.plan.stages[k].stage for k in added} == {"build", "smoke"}
    assert len(split.plan.targets) == len(whole.plan.targets) + len(h100_targets)
    for key in added:
        run = split.plan.stages[key]
        assert run.toolchain.get("driver") in (None, "575.51.03")
        assert split.toolchains[key].for_gpu(H100).driver == "575.51.03"
        if placement(split.plan, run).pool == H100:
            assert split.nodes[key] == {b}
    for key, run in whole.plan.stages.items():  # the first group's: on its nodes alone
        assert split.toolchains[key].for_gpu(H100).driver == "570.124.06"
        if run.stage in ("build", "smoke") and run.gpu == H100 and run.gpus:
            assert split.nodes[key] == {a, c}
    converts = [k for k, r in split.plan.stages.items() if r.stage == "convert"]
    assert converts
    assert not set(converts) & set(split.nodes)  # a convert has no driver: either group
    assert sorted(split.group_keys) == [(H100, 0), (H100, 1), ("L40S", 0)]


def test_the_cpu_pool_ignores_gpus_and_drivers() -> None:
    mixed = [probe("a", gpu=None, sm=None, driver=None), probe("b")]
    assert disagreement(CPU_POOL, mixed) is None
    assert pool_toolchain(CPU_POOL, mixed[1].toolchain).driver is None
    assert pool_toolchain(H100, mixed[1].toolchain).driver == "570.124.06"
