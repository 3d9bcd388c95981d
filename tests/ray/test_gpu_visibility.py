"""What GPUs a stage's tools see on a real local Ray cluster (tests/ray/conftest.py).

Ray 2.60 sets CUDA_VISIBLE_DEVICES to a task's assigned ids when it has GPUs and leaves it
alone when it has none (ray/_private/utils.py `set_visible_accelerator_ids`), so a zero-GPU
task would see every GPU of its node. enginectl empties it for such runs
(pipeline.executors.ray_tasks). Here every worker starts with all eight GPUs of a node
visible (CUDA_VISIBLE_DEVICES forwarded through the job's runtime env, as a node's own
environment would carry it), and the stand-ins record what they were started with: the
convert (no GPU asked, on an H100 node) sees none, each engine build exactly its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ray.fleet import FakeCluster, enginectl, fleet_recipe

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-2")  # its cluster: conftest.py


EVERY_GPU = "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize("fleet_env", [("file", "sqlite")], indirect=True, ids=["file-sqlite"])
def test_a_zero_gpu_run_sees_no_gpu_and_a_gpu_run_sees_its_own(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    record = tmp_path / "gpu-env.jsonl"
    env = {**fleet_env, "FAKE_GPU_ENV_LOG": str(record), "CUDA_VISIBLE_DEVICES": EVERY_GPU,
           "ENGINECTL_RAY_ENV": "FAKE_GPU_ENV_LOG,CUDA_VISIBLE_DEVICES"}
    recipe = fleet_recipe(tmp_path, gpu=["h100"], tp=[1, 2], include=[],
                          exclude=[{"runtime": "vllm"}])
    summary = json.loads(enginectl(env, "build", str(recipe), "--executor", "ray",
                                   "--json").stdout)
    assert summary["failed"] == 0, summary
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    converts = [s["cuda_visible_devices"] for s in seen if s["tool"] == "convert_checkpoint.py"]
    builds = [s["cuda_visible_devices"] for s in seen if s["tool"] == "trtllm-build"]
    assert converts == ["", ""]  # tp 1 and tp 2: Ray gave them no GPU, so they see none
    assert sorted(len(ids.split(",")) for ids in builds) == [1, 2]  # tp GPUs each
    for ids in builds:  # Ray's assignment on a two-GPU node, not the node's every GPU
        assert set(ids.split(",")) <= {"0", "1"}
    on_gpu = [s for s in summary["stages"] if s["stage"] in ("convert", "build")]
    nodes = {ray_cluster.node_named(s["node"]["node_id"]) for s in on_gpu}
    assert nodes <= {"h100-a", "h100-b"}  # the converts ran on GPU nodes all the same
