"""`build: {strip_plan: true}`: the build key, the argv of trtllm-build and trtllm-refit, and
the store bytes `plan` shows."""

from __future__ import annotations

from pathlib import Path

from pipeline.executors.preview import store_bytes, store_bytes_line
from pipeline.planning.plan import KIND_ENGINE
from pipeline.stages.refit import PLAN_FRACTION
from tests.helpers import plan_of, recipe_data


def _data(strip: bool | None) -> dict[str, object]:
    data = recipe_data("llama70b-h100.yaml")
    data["build"] = {k: v for k, v in data["build"].items() if k != "strip_plan"}
    if strip is not None:
        data["build"]["strip_plan"] = strip
    return data


def test_off_by_default_and_the_keys_of_whole_engines_unchanged(tmp_path: Path) -> None:
    default = plan_of(_data(None), tmp_path, "a.yaml")
    off = plan_of(_data(False), tmp_path, "b.yaml")
    assert set(default.stages) == set(off.stages)
    assert not any("--strip_plan" in (run.argv or []) for run in default.stages.values())
    assert not any(run.before for run in default.stages.values())


def test_strip_plan_is_in_the_build_key_and_argv_with_the_refit_before_smoke(
        tmp_path: Path) -> None:
    whole = plan_of(_data(False), tmp_path, "a.yaml")
    stripped = plan_of(_data(True), tmp_path, "b.yaml")
    builds = [run for run in stripped.stages.values() if run.kind == KIND_ENGINE]
    whole_builds = {run.key for run in whole.stages.values() if run.kind == KIND_ENGINE}
    assert builds
    assert not {run.key for run in builds} & whole_builds
    for run in builds:
        assert run.params["flags"]["--strip_plan"] == "enable"
        assert run.argv is not None
        assert run.argv.count("--strip_plan") == 1
        assert run.argv[run.argv.index("--strip_plan") + 1].startswith("--")  # no value
        smoke = next(s for s in stripped.stages.values()
                     if s.stage == "smoke" and s.inputs == [run.key])
        (refit,) = smoke.before
        assert refit == ["trtllm-refit", "--engine_dir", str(run.workdir / "out"),
                         "--checkpoint_dir", str(stripped.stages[run.inputs[0]].workdir / "out"),
                         "--output_dir", str(smoke.workdir / "refit")]
        commands = stripped.commands()
        assert commands.index(refit) == commands.index(smoke.argv) - 1  # refit, then serve
    # the checkpoints stay what they were: one per (quant, tp), shared by both plans
    assert {r.key for r in stripped.stages.values() if r.stage == "quantize"} == \
        {r.key for r in whole.stages.values() if r.stage == "quantize"}


def test_store_bytes_whole_and_stripped(tmp_path: Path) -> None:
    plan = plan_of(_data(True), tmp_path)
    found = store_bytes(plan)
    engines = [run for run in plan.stages.values() if run.kind == KIND_ENGINE]
    assert found["engines"] == len(engines) == 5
    engine_bytes = found["whole_bytes"] - found["checkpoint_bytes"]
    assert found["plan_bytes"] == round(engine_bytes * PLAN_FRACTION)
    assert found["stripped_bytes"] == found["checkpoint_bytes"] + found["plan_bytes"]
    assert found["whole_bytes"] / found["stripped_bytes"] > 2
    line = store_bytes_line(found)
    assert "5 engines; strip_plan: true" in line
    assert "weight-stripped" in line
