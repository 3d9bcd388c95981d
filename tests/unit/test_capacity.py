"""GPU count is the node's fault: the one check (`pipeline.planning.capacity.shortfall`), what
a run, an artifact and a node count, the Ray preflight that refuses a run no node can hold,
and the notes `plan` prints. The node's count is read from the nvidia-smi stand-in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pipeline.errors import FleetError, MachineError
from pipeline.executors.pools import NodeInfo, fleet_of, oversized
from pipeline.executors.ray_build import preflight
from pipeline.planning.capacity import (
    GpuNeed,
    NodeGpus,
    labels_need,
    on_this_node,
    plan_notes,
    run_need,
    shortfall,
    this_node,
    too_few_gpus,
)
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.recipe.reader import load_recipe
from pipeline.settings import Settings
from tests.helpers import FAKES, fake_gpu
from tests.integration.builds import make_model

H100 = "H100-SXM5-80GB"
TP8 = GpuNeed.ranks(H100, 8, 1)


@pytest.mark.parametrize(("need", "node", "expected"), [
    (TP8, NodeGpus(H100, 4),
     f"needs 8 GPUs (tp 8 x pp 1), this node has 4 (nvidia-smi); run it on a node with 8 {H100}"),
    (GpuNeed.ranks(H100, 2, 2), NodeGpus(H100, 2),
     f"needs 4 GPUs (tp 2 x pp 2), this node has 2 (nvidia-smi); run it on a node with 4 {H100}"),
    (TP8, NodeGpus(H100, 8), None),
    (TP8, NodeGpus("L40S", 4), None),  # another SKU: the smoke awaits an H100 node instead
    (TP8, NodeGpus(None, 0), None),  # no GPU listed: not this check's call
    (GpuNeed.ranks("CPU", 1, 1), NodeGpus(None, 0), None),  # vLLM on the CPU needs none
    (GpuNeed.ranks(None, 2, 1), NodeGpus("L40S", 1),  # an entry runs on the node's GPUs
     "needs 2 GPUs (tp 2 x pp 1), this node has 1 (nvidia-smi); run it on a node with 2 GPUs"),
    (GpuNeed.ranks(None, 1, 1), NodeGpus("L40S", 1), None),
])
def test_shortfall_names_the_need_the_count_and_where_to_run_it(
    need: GpuNeed, node: NodeGpus, expected: str | None
) -> None:
    found = shortfall(need, node)
    assert (None if found is None else str(found)) == expected


def test_the_error_is_a_machine_error_exit_3() -> None:
    found = shortfall(TP8, NodeGpus(H100, 4))
    assert found is not None
    error = found.error("target llama-h100-tp8")
    assert isinstance(error, MachineError)
    assert error.exit_code == 3
    assert str(error) == ("target llama-h100-tp8: needs 8 GPUs (tp 8 x pp 1), this node has 4 "
                          f"(nvidia-smi); run it on a node with 8 {H100}")


def test_labels_count_tp_times_pp_and_the_cpu_none() -> None:
    assert labels_need({"gpu": H100, "tp": 2, "pp": 2}) == GpuNeed(H100, 4, "tp 2 x pp 2")
    assert labels_need({"tp": 2}).gpus == 2  # an entry: any SKU
    assert labels_need({"gpu": "CPU", "tp": 1, "pp": 1}).gpus == 0
    assert labels_need({}).gpus == 1


def test_cuda_visible_devices_narrows_what_nvidia_smi_lists(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert on_this_node(H100, 8) == NodeGpus(H100, 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    node = on_this_node(H100, 8)
    assert (node.count, node.source) == (2, "nvidia-smi, CUDA_VISIBLE_DEVICES='0,1'")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7,8")
    assert on_this_node(H100, 4).count == 4


def test_this_node_is_what_the_nvidia_smi_stand_in_lists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for name, value in fake_gpu(tmp_path / "gpu", count=4).items():
        monkeypatch.setenv(name, value)
    assert this_node() == NodeGpus(H100, 4)
    assert too_few_gpus({"gpu": H100, "tp": 8, "pp": 1}) == \
        "needs 8 GPUs (tp 8 x pp 1), this node has 4 (nvidia-smi)"
    assert too_few_gpus({"gpu": H100, "tp": 4, "pp": 1}) is None
    monkeypatch.delenv("FAKE_NVIDIA_SMI_CONFIG")  # the stand-in: no driver loaded
    assert this_node() == NodeGpus(None, 0)
    assert too_few_gpus({"gpu": H100, "tp": 8, "pp": 1}) is None


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    make_model(tmp_path / "model")
    recipe = {"model": {"name": "toy", "source": "./model"},
              "matrix": {"gpu": ["h100", "cpu"], "tp": [1, 2], "quant": ["bf16"],
                         "shape": [{"max_batch_size": 2, "max_input_len": 64,
                                    "max_seq_len": 128}],
                         "exclude": [{"gpu": "cpu", "runtime": "trtllm"},
                                     {"gpu": "cpu", "tp": 2}]},
              "serve": {"trtllm": {}, "vllm": {}}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return plan_recipe(load_recipe(path), Settings.from_env({"ENGINECTL_HOME": str(tmp_path)}))


def test_engine_builds_and_gpu_smokes_need_tp_times_pp(plan: Plan) -> None:
    seen = set()
    for run in plan.stages.values():
        target = plan.target(run.targets[0])
        need = run_need(plan, run)
        gpu_run = (run.stage == "build" and run.kind == "trtllm-engine") or (
            run.stage == "smoke" and not target.gpu.is_cpu)
        if gpu_run:
            assert need == GpuNeed.ranks(H100, target.tp, 1)
        else:  # snapshot, convert, no-build entries, the CPU target's smoke
            assert need is None
        seen.add((run.stage, None if need is None else need.gpus))
    assert {("build", 2), ("smoke", 2), ("smoke", 1), ("convert", None)} <= seen


def test_plan_notes_each_target_this_node_lacks_the_gpus_for(plan: Plan) -> None:
    notes = plan_notes(plan, NodeGpus(H100, 1))
    tp2 = sorted(t.target.id for t in plan.targets if t.target.tp == 2)
    assert len(notes) == len(tp2) == 2
    assert notes[0].startswith(f"target {tp2[0]}: needs 2 GPUs (tp 2 x pp 1), this node has 1 "
                               "(nvidia-smi), so a build here refuses it (exit 3); run it on")
    assert plan_notes(plan, NodeGpus(H100, 2)) == []
    assert plan_notes(plan, NodeGpus(None, 0)) == []  # a laptop: nothing known


def node(name: str, **resources: float) -> NodeInfo:
    return NodeInfo(f"{name:0<56}", name, "10.0.0.1", {"CPU": 8.0, **resources})


def test_a_ray_run_no_node_can_hold_is_refused_before_submitting(plan: Plan) -> None:
    """Two 1-GPU H100 nodes are 2 GPUs in the pool, but no node holds a tp 2 run: Ray
    would leave it pending forever."""
    fleet = fleet_of([node("a", **{f"gpu:{H100}": 1}), node("b", **{f"gpu:{H100}": 1}),
                      node("c")])
    tp2 = {t.target.id for t in plan.targets if t.target.tp == 2}
    found = oversized(plan, fleet)
    assert set(found) == tp2
    assert str(next(iter(found.values()))) == (
        f"needs 2 GPUs (tp 2 x pp 1), the largest node of pool {H100} has 1 (its gpu:{H100} "
        f"resource); run it on a node with 2 {H100}")
    with pytest.raises(MachineError) as refused:
        preflight(plan, fleet, keep_going=False, registry_url="postgresql://x/y")
    assert refused.value.exit_code == 3
    message = str(refused.value)
    assert message.startswith(f"no node of the Ray cluster has the GPUs for 2 targets: target "
                              f"{sorted(tp2)[0]}: needs 2 GPUs")
    assert message.endswith("or pass --keep-going to skip them")
    assert "\n" not in message
    skipped, note = preflight(plan, fleet, keep_going=True, registry_url="postgresql://x/y")
    assert skipped == tp2
    assert note is not None
    assert note.startswith("skipping the targets no node has the GPUs for: target ")
    big = fleet_of([node("a", **{f"gpu:{H100}": 2}), node("c")])
    assert oversized(plan, big) == {}
    assert preflight(plan, big, keep_going=False, registry_url="postgresql://x/y") == (set(),
                                                                                       None)


def test_a_missing_sku_is_still_the_fleets_error(plan: Plan) -> None:
    with pytest.raises(FleetError):
        preflight(plan, fleet_of([node("c")]), keep_going=False,
                  registry_url="postgresql://x/y")
