"""Too few GPUs is the node's fault (issue 22): on a node whose nvidia-smi (the stand-in in
tests/fakes/bin, told how many GPUs to list) lists fewer GPUs of the target's SKU than its
tp × pp, the local build refuses the engine build and the smoke run before they start, as do
`enginectl smoke` and the nightly's re-proof: exit 3, one line naming the target, tp × pp and
the count; nothing smoked, no quarantine, the engine's status and record as they were.
`plan` says it ahead. Real processes, registry and store; TensorRT-LLM's programs are the
stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from registry.sql.db import open_registry
from registry.sql.leases import get_stage_run
from registry.sql.records import get_artifact, list_artifacts
from registry.sql.smoke_records import smoke_reports
from tests.cli_forkserver import run_cli
from tests.helpers import FAKES, builder_env, enginectl, fake_gpu
from tests.integration.builds import ENGINECTL, build, make_model, smoke

H100 = "H100-SXM5-80GB"
NEEDS = "needs 2 GPUs (tp 2 x pp 1), this node has 1 (nvidia-smi)"


def tp2_recipe(directory: Path) -> Path:
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "tp": [2], "quant": ["bf16"], "shape": [
            {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}]},
        "serve": {"trtllm": {}},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def without_trtllm_serve(directory: Path) -> Path:
    """TensorRT-LLM's build stand-ins and nvidia-smi, but no trtllm-serve."""
    directory.mkdir(parents=True)
    for name in ("nvidia-smi", "trtllm-build"):
        (directory / name).symlink_to(FAKES / "bin" / name)
    return directory


def error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("enginectl: error:")]
    return line


def stages(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    return {s["stage"]: s for s in json.loads(done.stdout)["stages"]}


@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_too_few_gpus_refuses_build_smoke_and_nightly_and_touches_no_status(
    tmp_path: Path, registry_url: str
) -> None:
    env = builder_env(tmp_path, registry_url)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the count is nvidia-smi's alone here
    one = {**env, **fake_gpu(tmp_path / "one", count=1)}
    recipe = tp2_recipe(tmp_path)

    planned = enginectl(one, "plan", recipe)
    target = f"{H100}/tp2/pp1/bf16/kv-auto/small/trtllm"
    assert f"enginectl: note: target {target}: {NEEDS}, so a build here refuses it" in \
        planned.stderr
    for other in (env, {**env, **fake_gpu(tmp_path / "enough", count=2)}):  # no GPU, enough
        quiet = enginectl(other, "plan", recipe)
        assert "needs 2 GPUs" not in quiet.stderr

    refused = build(one, recipe, "--json", code=3)  # the engine build never starts
    line = error_line(refused.stderr)
    assert line.startswith("enginectl: error: build ")
    assert f"({target}): {NEEDS}; run it on a node with 2 {H100}" in line
    ran = stages(refused)
    assert (ran["build"]["status"], ran["smoke"]["status"]) == ("failed", "skipped")
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert list_artifacts(session, kind="trtllm-engine") == []
        assert get_stage_run(session, str(ran["build"]["key"])) is None  # no lease taken

    # two GPUs, no trtllm-serve: the engine is built (the GPU count is no part of its key)
    # and its smoke awaits a server; a node with one GPU must leave it so
    two = {**env, **fake_gpu(tmp_path / "two", count=2), "PATH": os.pathsep.join(
        [str(without_trtllm_serve(tmp_path / "bin")), *env["PATH"].split(os.pathsep)[1:]])}
    built = stages(build(two, recipe, "--json"))
    assert built["smoke"]["status"] == "pending-smoke"
    assert "trtllm-serve is not on PATH" in str(built["smoke"]["error"])
    engine = str(built["build"]["digest"])
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        before = get_artifact(session, engine)
    assert before is not None
    assert before.status == "built"

    refused = build(one, recipe, "--json", code=3)  # the smoke run never starts
    assert f"({target}): {NEEDS}; run it on a node with 2 {H100}" in \
        error_line(refused.stderr)
    ran = stages(refused)
    assert (ran["build"]["status"], ran["smoke"]["status"]) == ("reused", "failed")
    smoked = smoke(one, engine, code=3)
    assert f"cannot smoke {engine} here: {NEEDS}; its status stays built" in smoked.stderr
    night = run_cli([ENGINECTL, "nightly", "--json", str(recipe)], env=one, timeout=600)
    assert night.returncode == 3, (night.stdout, night.stderr)
    (failure,) = [f for f in json.loads(night.stdout)["failures"] if f["stage"] == "smoke"]
    assert failure["outcome"] == "failed"
    assert NEEDS in failure["error"]

    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        after = get_artifact(session, engine)
        assert smoke_reports(session, engine) == []
        assert get_stage_run(session, str(ran["smoke"]["key"])) is None
    assert after is not None
    assert (after.status, after.status_reason) == (before.status, before.status_reason)
