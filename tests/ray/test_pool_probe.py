"""Each Ray pool's fingerprint is what its own nodes report (tests/ray/conftest.py): the builder
image digest from each node's ENGINECTL_IMAGE_DIGEST, never the driver's; the CUDA its driver
runs from its own nvidia-smi; vLLM from its own vLLM Python (none on these nodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.sql.build_inputs import toolchain_history
from registry.sql.db import open_registry
from tests.ray.fleet import H100, IMAGES, FakeCluster, enginectl, fleet_recipe

pytestmark = pytest.mark.xdist_group("tests/ray::ray_cluster-2")  # its cluster: conftest.py


FILE_SQLITE = pytest.mark.parametrize("fleet_env", [("file", "sqlite")], indirect=True,
                                      ids=["file-sqlite"])


@FILE_SQLITE
def test_each_pool_keys_with_the_image_digest_its_own_nodes_report(
    fleet_env: dict[str, str], tmp_path: Path, ray_cluster: FakeCluster
) -> None:
    recipe = fleet_recipe(tmp_path)
    driver_image = "sha256:" + "dd" * 32  # the driver runs another image than any node
    on_driver = {**fleet_env, "ENGINECTL_IMAGE_DIGEST": driver_image}
    args = ("build", str(recipe), "--executor", "ray", "--dry-run", "--json")
    with_digest = json.loads(enginectl(on_driver, *args).stdout)
    without = json.loads(enginectl(fleet_env, *args).stdout)
    # the driver's digest reaches no key: both dry runs key every stage alike
    assert [s["key"] for s in with_digest["stages"]] == [s["key"] for s in without["stages"]]

    nodes = ray_cluster.nodes
    with open_registry(fleet_env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        for pool, node in ((H100, "h100-a"), ("L40S", "l40s"), ("CPU", "head")):
            probes = toolchain_history(session, pool, limit=20)
            assert probes, pool
            assert {p.fingerprint["image"] for p in probes} == {IMAGES[node]}, pool
            assert {p.fingerprint["vllm"] for p in probes} == {None}  # no vLLM on the nodes
        h100 = toolchain_history(session, H100, limit=20)
        assert {p.node_id for p in h100} == {nodes["h100-a"].node_id, nodes["h100-b"].node_id}
        # 570.124.06 runs CUDA 12.8 (its branch's, in nvidia-smi's banner); the image's CUDA
        # toolkit is torch.version.cuda in the node's builder Python (a CPU torch here: none)
        assert {p.fingerprint["driver_cuda"] for p in h100} == {"12.8"}
        assert {p.fingerprint["cuda"] for p in h100} == {None}
    assert IMAGES["h100-a"] != IMAGES["l40s"] != driver_image
