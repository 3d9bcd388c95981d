"""Promotion channels, the regression gate's comparison, and what a toolchain bump changes:
the pure parts of `promote:`, `enginectl nightly` and `plan --toolchain`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import RecipeError
from pipeline.executors.preview import parse_overrides
from pipeline.nightly.diff import key_changes, toolchain_changes
from pipeline.planning.plan import plan_recipe
from pipeline.planning.toolchain import BUILDER_IMAGE
from pipeline.serving.promote import compare_levels
from registry.errors import UsageError
from tests.helpers import plan_of, recipe_data


def fleet(promote: list[dict[str, Any]]) -> dict[str, Any]:
    data = recipe_data("llama70b-h100.yaml")
    data["promote"] = promote
    return data


def test_each_alias_names_one_target(tmp_path: Path) -> None:
    plan = plan_of(fleet([{"alias": "llama70b/{gpu}/{quant}/{tp}/{shape}/{runtime}"},
                          {"alias": "llama70b/{gpu}/prod",
                           "match": {"runtime": "trtllm", "quant": "fp8", "shape": "chat",
                                     "tp": 8}}]), tmp_path)
    names = [c.alias for c in plan.channels]
    assert len(names) == len(set(names)) == len(plan.targets) + 1
    prod = next(c for c in plan.channels if c.alias == "llama70b/h100-sxm5-80gb/prod")
    assert prod.target == "H100-SXM5-80GB/tp8/pp1/fp8/kv-fp8/chat/trtllm"
    chain = next(p.chain for p in plan.targets if p.target.id == prod.target)
    assert (prod.entry, prod.smoke) == (chain[-2], chain[-1])
    assert prod.max_regression == 0.05


@pytest.mark.parametrize(("promote", "message"), [
    ([{"alias": "llama70b/{gpu}/prod"}], "would name two targets"),
    ([{"alias": "x/{tp}"}, {"alias": "x/{tp}"}], "would name two targets"),
    ([{"alias": "x/{gpux}"}], "unknown placeholder {gpux}"),
    ([{"alias": "X/{gpu}/{quant}/{tp}/{shape}/{runtime}"}], "not a valid alias"),
    ([{"alias": "x", "match": {"quant": "nvfp4"}}], "selects no target"),
    ([{"alias": "x/{tp}", "max_regression": 1.5}], "max_regression"),
])
def test_bad_channels_are_recipe_errors(tmp_path: Path, promote: list[dict[str, Any]],
                                        message: str) -> None:
    with pytest.raises(RecipeError, match="promote") as caught:
        plan_of(fleet(promote), tmp_path)
    assert message in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_recipe_without_channels_keeps_its_digest(tmp_path: Path) -> None:
    data = recipe_data("llama70b-h100.yaml")
    assert data.pop("promote")  # the shipped recipe has a channel
    without = plan_of(data, tmp_path).loaded.digest
    assert without == plan_of(fleet([]), tmp_path).loaded.digest
    assert without != plan_of(fleet([{"alias": "a/{gpu}/{quant}/{tp}/{shape}/{runtime}"}]),
                              tmp_path).loaded.digest


def report(*levels: tuple[int, float, float]) -> dict[str, Any]:
    return {"load": [{"concurrency": c, "output_tokens_per_s": tps, "ttft_p50_s": ttft}
                     for c, tps, ttft in levels]}


@pytest.mark.parametrize(("new", "regressed"), [
    (report((1, 96.0, 0.1), (4, 380.0, 0.2)), [False, False]),  # within 5%
    (report((1, 94.0, 0.1), (4, 400.0, 0.2)), [True, False]),   # 6% slower at c=1
    (report((1, 200.0, 0.1)), [False, False]),                  # c=4 not measured: no verdict
])
def test_compare_levels(new: dict[str, Any], regressed: list[bool]) -> None:
    old = report((1, 100.0, 0.1), (4, 400.0, 0.2))
    levels = compare_levels(old, new, 0.05)
    assert [lv.concurrency for lv in levels] == [1, 4]
    assert [lv.regressed for lv in levels] == regressed
    assert not any(lv.regressed for lv in compare_levels(old, new, None))
    assert levels[0].old_tokens_per_s == 100.0


def test_a_driver_bump_changes_engines_and_smokes_only(tmp_path: Path) -> None:
    plan = plan_of(recipe_data("llama70b-h100.yaml"), tmp_path)
    bumped = plan_recipe(plan.loaded, _settings(tmp_path), _with(driver="575.57.08"))
    before = plan_recipe(plan.loaded, _settings(tmp_path), _with(driver="570.124.06"))
    changes = key_changes(before, bumped)
    assert {c.stage for c in changes} == {"build", "smoke"}
    kinds = {bumped.stages[c.new_key].kind for c in changes if c.stage == "build"}
    assert kinds == {"trtllm-engine"}  # entries of checkpoints keep their digest
    assert all(c.because == ("driver 570.124.06 → 575.57.08",) for c in changes)
    assert toolchain_changes(None, {"driver": "1"}) == []
    [field] = toolchain_changes({"driver": "1", "cuda": "12.8"}, {"driver": "2", "cuda": "12.8"})
    assert (field.field, field.old, field.new) == ("driver", "1", "2")


def _settings(directory: Path) -> Any:
    from pipeline.settings import Settings

    return Settings.from_env({"ENGINECTL_HOME": str(directory)})


def _with(**fields: str) -> Any:
    from dataclasses import replace

    return replace(BUILDER_IMAGE, **fields)


def test_parse_overrides() -> None:
    assert parse_overrides(["driver=575.57.08", "cuda=13.1"]) == {"driver": "575.57.08",
                                                                  "cuda": "13.1"}
    for bad in ("driver", "gpu=H100", "drivr=1", "driver="):
        with pytest.raises(UsageError, match="--toolchain"):
            parse_overrides([bad])
