"""The plan: what is shared, which keys change when, and what the checks refuse."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pipeline.errors import PlanError
from registry.sql.lookup import Probed
from tests.helpers import keys_by_stage, plan_of, recipe_data


@pytest.fixture
def seed() -> dict:
    return recipe_data("llama70b-h100.yaml")


def test_work_is_shared_by_key(seed: dict, tmp_path: Path) -> None:
    plan = plan_of(seed, tmp_path)
    stages = keys_by_stage(plan)
    assert len(plan.targets) == 12
    assert len(stages["snapshot"]) == 1
    (snapshot,) = stages["snapshot"]
    assert len(plan.stages[snapshot].targets) == 12
    # fp8 and int4 for TRT-LLM at tp 8, int4 at tp 1, and one HF export per quant.
    assert len(stages["quantize"]) == 5
    assert "convert" not in stages
    assert len(stages["smoke"]) == 12


def test_yaml_order_comments_and_file_name_do_not_change_keys(seed: dict, tmp_path: Path) -> None:
    base = plan_of(seed, tmp_path)
    reordered = dict(reversed(list(copy.deepcopy(seed).items())))
    reordered["matrix"] = dict(reversed(list(reordered["matrix"].items())))
    other = tmp_path / "b"
    other.mkdir()
    again = plan_of(reordered, other, "renamed-recipe.yaml")
    # Work dirs differ with ENGINECTL_HOME; keys must not.
    assert set(base.stages) == set(again.stages)


def test_a_new_shape_builds_one_engine_and_nothing_upstream(seed: dict, tmp_path: Path) -> None:
    before = keys_by_stage(plan_of(seed, tmp_path))
    grown = copy.deepcopy(seed)
    grown["matrix"]["tp"] = [8]
    grown["matrix"]["exclude"] = []
    grown["matrix"]["quant"] = ["fp8"]
    smaller = keys_by_stage(plan_of(grown, tmp_path))
    grown["matrix"]["shape"].append(
        {"name": "mid", "max_batch_size": 64, "max_input_len": 4096, "max_seq_len": 8192}
    )
    bigger = keys_by_stage(plan_of(grown, tmp_path))
    assert bigger["snapshot"] == smaller["snapshot"] == before["snapshot"]
    assert bigger["quantize"] == smaller["quantize"]
    new_builds = bigger["build"] - smaller["build"]
    # one engine, one TRT-LLM PyTorch entry and one vLLM entry for the new shape
    assert len(new_builds) == 3
    assert smaller["build"] <= bigger["build"]


def test_shape_changes_build_key_not_quantize_key(seed: dict, tmp_path: Path) -> None:
    before = keys_by_stage(plan_of(seed, tmp_path))
    changed = copy.deepcopy(seed)
    changed["matrix"]["shape"][0]["max_batch_size"] = 64
    after = keys_by_stage(plan_of(changed, tmp_path))
    assert after["quantize"] == before["quantize"]
    assert after["snapshot"] == before["snapshot"]
    assert after["build"] != before["build"]
    assert before["build"] & after["build"], "the long-context builds did not change"


def test_calibration_changes_quantize_and_build_not_snapshot(seed: dict, tmp_path: Path) -> None:
    before = keys_by_stage(plan_of(seed, tmp_path))
    changed = copy.deepcopy(seed)
    changed["quantize"]["calibration"]["samples"] = 256
    after = keys_by_stage(plan_of(changed, tmp_path))
    assert after["snapshot"] == before["snapshot"]
    assert not after["quantize"] & before["quantize"]
    assert after["build"] != before["build"]


def test_driver_bump_rebuilds_engines_only_and_policy_can_ignore_it(
    seed: dict, tmp_path: Path
) -> None:
    def plan_with(toolchain: dict) -> dict[str, set[str]]:
        data = copy.deepcopy(seed)
        data["toolchain"] = toolchain
        return keys_by_stage(plan_of(data, tmp_path))

    old = plan_with({"driver": "570.124.06"})
    new = plan_with({"driver": "580.65.06"})
    assert old["quantize"] == new["quantize"]
    engine_keys_changed = old["build"] - new["build"]
    assert len(engine_keys_changed) == 5  # the compiled engines; the no-build entries stay
    assert old["smoke"] != new["smoke"]
    policy = ["cuda", "tensorrt", "trtllm", "image", "modelopt", "torch", "transformers", "vllm"]
    assert plan_with({"driver": "570.124.06", "rebuild_on": policy}) == plan_with(
        {"driver": "580.65.06", "rebuild_on": policy}
    )


@pytest.mark.parametrize("name", ["h100", "H100-SXM", "NVIDIA H100 80GB HBM3", "h100_sxm"])
def test_gpu_spellings_give_the_same_keys(seed: dict, tmp_path: Path, name: str) -> None:
    changed = copy.deepcopy(seed)
    changed["matrix"]["gpu"] = [name]
    assert set(plan_of(changed, tmp_path).stages) == set(plan_of(seed, tmp_path).stages)


def test_trtllm_without_quantization_converts_once_per_tp_pp_dtype(tmp_path: Path) -> None:
    data = recipe_data("llama8b-fleet.yaml")
    plan = plan_of(data, tmp_path)
    stages = keys_by_stage(plan)
    assert len(stages["convert"]) == 1  # bf16, tp 1: shared by A100, L40S and H100
    (convert,) = stages["convert"]
    assert len(plan.stages[convert].targets) == 3


def test_seventy_b_bf16_on_one_h100_does_not_fit_and_says_what_does(
    seed: dict, tmp_path: Path
) -> None:
    data = copy.deepcopy(seed)
    data["matrix"].update(tp=[1], quant=["bf16"], kv_cache_dtype=["auto"], exclude=[])
    data["serve"] = {"trtllm": {}}
    with pytest.raises(PlanError, match=r"does not fit.*tp \d+ fits"):
        plan_of(data, tmp_path)


def test_include_adds_targets_that_exclude_removed(seed: dict, tmp_path: Path) -> None:
    data = copy.deepcopy(seed)
    data["matrix"]["include"] = [
        {"tp": 1, "quant": "fp8", "shape": "long", "runtime": "trtllm", "kv_cache_dtype": "fp8"}
    ]
    data["matrix"]["shape"][1]["max_batch_size"] = 1
    data["matrix"]["shape"][1]["max_seq_len"] = 8192
    data["matrix"]["shape"][1]["max_input_len"] = 4096
    data["matrix"]["shape"][1]["max_num_tokens"] = 8192
    plan = plan_of(data, tmp_path)
    ids = [t.target.id for t in plan.targets]
    assert "H100-SXM5-80GB/tp1/pp1/fp8/kv-fp8/long/trtllm" in ids


def test_reference_outputs_change_only_the_smoke_keys(seed: dict, tmp_path: Path) -> None:
    before = keys_by_stage(plan_of(seed, tmp_path))
    changed = copy.deepcopy(seed)
    changed["smoke"]["reference"] = [{"prompt": "The capital of France is",
                                      "output": " Paris."}]
    after = keys_by_stage(plan_of(changed, tmp_path))
    assert after["build"] == before["build"]
    assert not after["smoke"] & before["smoke"]


def _probed(pool: str, gpu: str, driver: str, at: str, node: str | None = None) -> Probed:
    return Probed({"gpu": None if gpu == "CPU" else gpu, "driver": driver}, pool, at, pool,
                  gpu, node)


H100 = "H100-SXM5-80GB"
RECORDED = [  # newest first, as registry.sql.lookup.recorded_pools returns them
    _probed("host:laptop", "CPU", "-", "2026-12-05"),
    _probed("host:gpu-b", H100, "575", "2026-12-04"),
    _probed(H100, H100, "570", "2026-12-03", "n1"),
    _probed(H100, H100, "575", "2026-12-03", "n2"),
    _probed("host:laptop", H100, "565", "2026-12-01"),
    _probed("host:gpu-c", "L40S", "570", "2026-11-30"),
]


@pytest.mark.parametrize(("sku", "ray", "here", "named", "expected"), [
    (H100, False, "host:laptop", (), [("host:laptop", "565")]),  # this machine ran H100
    (H100, False, "host:other", (), [("host:gpu-b", "575")]),  # else the newest host
    (H100, True, "host:laptop", (), [(H100, "570"), (H100, "575")]),  # the Ray pool's groups
    (H100, False, "host:laptop", ("host:gpu-b",), [("host:gpu-b", "575")]),
    (H100, True, "host:laptop", ("host:gpu-c",), [(H100, "570"), (H100, "575")]),  # no H100
    ("L40S", True, "host:x", (), [("host:gpu-c", "570")]),  # no Ray pool: a host that ran it
    ("A100-SXM4-80GB", False, "host:x", (), []),  # never probed: the builder image
])
def test_the_pool_that_keys_a_target_is_the_one_that_runs_its_gpu(
    sku: str, ray: bool, here: str, named: tuple[str, ...], expected: list[tuple[str, str]]
) -> None:
    from pipeline.executors.preview import pool_of

    found = pool_of(RECORDED, sku, ray=ray, here=here, named=named)
    assert [(p.pool, p.fingerprint["driver"]) for p in found] == expected
