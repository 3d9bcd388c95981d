"""`plan` keys each target as the pool that runs its GPU stages keys it (issue 22, item 5):
the GPU builder's recorded probe, not this machine's, so that a laptop predicts the builder's
keys and a build on the laptop changes nothing in that prediction.

The GPU builder is this machine with the nvidia-smi stand-in reporting an H100
(tests/fakes/bin/nvidia-smi); the laptop is the same machine without it (the stand-in then
answers as a machine whose driver is not loaded). Real registry, store and CLI.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

from registry.sql.build_inputs import record_toolchain, toolchain_history
from registry.sql.db import open_registry
from tests.cli_forkserver import run_cli
from tests.helpers import builder_env, fake_gpu
from tests.integration.builds import ENGINECTL, write_recipe

H100 = "H100-SXM5-80GB"


def plan(env: dict[str, str], recipe: Path, *args: str,
         code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, "plan", str(recipe), "--json", *args], env=env, timeout=300)
    assert done.returncode == code, (done.stdout[-2000:], done.stderr)
    return done


def build(env: dict[str, str], recipe: Path) -> dict[str, Any]:
    """The build's summary; whether its smokes pass is not what this file tests (exit 5)."""
    done = run_cli([ENGINECTL, "build", str(recipe), "--json"], env=env, timeout=600)
    assert done.returncode in (0, 5), (done.stdout[-2000:], done.stderr)
    summary: dict[str, Any] = json.loads(done.stdout)
    assert summary["failed"] == 0, summary
    return summary


def stages(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in json.loads(done.stdout)["stages"]}


def test_plan_keys_gpu_targets_as_their_pool_did_and_a_laptop_build_changes_nothing(
    tmp_path: Path, registry_url: str
) -> None:
    recipe = write_recipe(tmp_path, exclude=[{"runtime": "vllm"}])
    laptop = builder_env(tmp_path, registry_url)
    gpu_box = {**laptop, **fake_gpu(tmp_path / "gpu-box")}

    fresh = plan(laptop, recipe)
    assert fresh.stderr.startswith(f"enginectl: note: no toolchain is recorded for a pool "
                                   f"with {H100} in ")
    assert "builder image's versions" in fresh.stderr

    on_gpu = build(gpu_box, recipe)
    built = {s["key"]: s for s in on_gpu["stages"]}
    predicted = plan(laptop, recipe)
    assert predicted.stderr == ""
    assert set(stages(predicted)) == set(built)  # the builder's keys, planned on the laptop
    for key, stage in stages(predicted).items():
        assert stage["built"] == (built[key]["status"] == "built"), stage
    engines = [s for s in stages(predicted).values() if s["kind"] == "trtllm-engine"]
    assert {s["toolchain"]["driver"] for s in engines} == {"570.124.06"}
    source = json.loads(predicted.stdout)["recipe"]["toolchain_sources"]
    assert [(s["gpu"], s["pool"]) for s in source] == [(H100, f"host:{socket.gethostname()}")]

    # the laptop builds the recipe itself (no GPU: engines keyed without a driver) and
    # records its own probe: the prediction for the H100 pool stays as it was
    on_laptop = build(laptop, recipe)
    assert {s["key"] for s in on_laptop["stages"]} != set(built)
    assert stages(plan(laptop, recipe)) == stages(predicted)
    with open_registry(registry_url) as registry, registry.session() as session:
        history = toolchain_history(session, f"host:{socket.gethostname()}", limit=5)
        assert [p.gpu for p in history] == ["CPU", H100]  # both builds recorded theirs
        probed = history[1].fingerprint
        record_toolchain(session, "host:laptop", None,
                         {**probed, "gpu": None, "sm": None, "driver": None,
                          "torch": "2.99.0"}, "laptop")
    after = plan(laptop, recipe)
    assert after.stderr == ""
    assert stages(after) == stages(predicted)
    on_ray = plan(laptop, recipe, "--executor", "ray")  # no Ray pool probed: the host's, said
    assert stages(on_ray) == stages(predicted)
    assert (f"enginectl: note: no Ray pool has recorded a probe of {H100}; its targets are "
            f"keyed with host host:{socket.gethostname()}'s, probed ") in on_ray.stderr

    # --pool names the builder to predict: another H100 host, on a newer driver
    with open_registry(registry_url) as registry, registry.session() as session:
        record_toolchain(session, "host:gpu-b", H100, {**probed, "driver": "575.51.03"}, "gpu-b")
    assert stages(plan(laptop, recipe)) == stages(predicted)  # this host ran H100 itself
    named = stages(plan(laptop, recipe, "--pool", "host:gpu-b"))
    moved = {named[k]["stage"] for k in set(named) - set(stages(predicted))}
    assert moved == {"build", "smoke"}  # the engines and every smoke; not the checkpoints
    assert {s["toolchain"]["driver"] for s in named.values()
            if s["kind"] == "trtllm-engine"} == {"575.51.03"}
    refused = plan(laptop, recipe, "--pool", "host:nowhere", code=2)
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("enginectl: error: --pool 'host:nowhere': no probe of it is "
                           "recorded in ")
    assert "host:gpu-b" in line
