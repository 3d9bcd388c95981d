"""A run that asks one node for more GPUs than any node of its pool has (tp 2 x pp 2 on the
test cluster's 2-GPU H100 nodes, 4 GPUs in the pool) is refused before anything is submitted,
as the node's fault: exit 3, one line, rather than a Ray task pending forever."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.ray.fleet import H100, enginectl, fleet_recipe

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-2")  # its cluster: conftest.py


@pytest.mark.parametrize("fleet_env", [("file", "postgresql")], indirect=True,
                         ids=["file-postgresql"])
def test_a_run_no_node_can_hold_fails_preflight_with_exit_3(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    matrix = {"gpu": ["h100"], "tp": [2], "pp": [2], "quant": ["bf16"],
              "shape": [{"name": "chat", "max_batch_size": 4, "max_input_len": 128,
                         "max_seq_len": 256}],
              "exclude": [{"runtime": "vllm"}]}
    recipe = fleet_recipe(tmp_path, matrix=matrix)
    done = enginectl(fleet_env, "build", str(recipe), "--executor", "ray", code=3, timeout=120)
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        "enginectl: error: no node of the Ray cluster has the GPUs for 1 target: target "
        f"{H100}/tp2/pp2/bf16/kv-auto/chat/trtllm: needs 4 GPUs (tp 2 x pp 2), the largest "
        f"node of pool {H100} has 2 (its gpu:{H100} resource); run it on a node with 4 {H100} "
        "(`ray start --resources`), or pass --keep-going to skip them")
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        assert list_artifacts(session) == []  # nothing was submitted
