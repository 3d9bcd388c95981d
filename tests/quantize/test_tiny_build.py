"""The CPU main job as CI runs it: `enginectl build` of the tiny recipe, for real.

Real snapshot, real modelopt FP8 and INT4-AWQ quantization (unified HF exports for the
TRT-LLM PyTorch backend), the PyTorch-backend and vLLM entries, all published to the
embedded defaults (SQLite, file store); the vLLM entry smoke-served with vLLM's CPU build
and so `ready`; then a second build reuses every stage.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import RECIPES, enginectl
from tests.models import offline_env


def test_tiny_recipe_builds_for_real_then_reuses_everything(
    tiny_model: Path, tmp_path: Path, vllm_python: Path
) -> None:
    data = yaml.safe_load((RECIPES / "tiny-llama-cpu.yaml").read_text())
    data["model"]["source"] = str(tiny_model)
    data["quantize"]["calibration"]["file"] = str(RECIPES / "calibration" / "tiny.jsonl")
    recipe = tmp_path / "tiny-llama-cpu.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {**offline_env(), "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_VLLM_PYTHON": str(vllm_python)}
    env.pop("ENGINECTL_REGISTRY_URL", None)
    env.pop("ENGINECTL_STORE_URL", None)

    def build(*args: str) -> dict:
        done = run_cli([ENGINECTL, "build", str(recipe), "--json", *args], env=env, timeout=1800)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = build("--jobs", "2")
    built = {(s["stage"], s["status"]) for s in first["stages"]}
    assert ("quantize", "built") in built
    # snapshot, two HF quantizations (FP8, INT4-AWQ), two PyTorch-backend entries, one vLLM
    # entry, and the vLLM entry's smoke run on vLLM's CPU build; the H100 entries await one
    assert first["built"] == 7
    assert first["failed"] == 0
    assert first["pending_smoke"] == 2
    assert ("smoke", "built") in built

    listed = json.loads(enginectl(env, "ls", "--json").stdout)
    statuses = {row["kind"]: row["status"] for row in listed}
    assert statuses["vllm"] == "ready"
    assert statuses["trtllm-checkpoint"] == "built"
    kinds = sorted(row["kind"] for row in listed)
    assert kinds == ["hf-checkpoint", "quantized-checkpoint", "quantized-checkpoint",
                     "trtllm-checkpoint", "trtllm-checkpoint", "vllm"]
    quantized = {row["quant"]: row for row in listed if row["kind"] == "quantized-checkpoint"}
    assert set(quantized) == {"fp8", "int4_awq"}

    fp8 = tmp_path / "fp8"
    subprocess.run([ENGINECTL, "fetch", quantized["fp8"]["digest"], "-o", str(fp8)], env=env,
                   check=True, capture_output=True)
    assert (fp8 / "config.json").is_file()
    assert (fp8 / "tokenizer.json").is_file()
    assert any(fp8.glob("*.safetensors"))
    assert "quantization_config" in json.loads((fp8 / "config.json").read_text()) or (
        fp8 / "hf_quant_config.json").is_file()

    again = build()
    assert again["built"] == 0
    assert again["reused"] == 7
    ranked = json.loads(enginectl(env, "resolve", "--model", "tiny-llama", "--gpu", "cpu",
                                  "--json").stdout)
    assert ranked["candidates"][0]["kind"] == "vllm"
    assert ranked["candidates"][0]["tokens_per_s"] > 0

    vllm_entry = ranked["candidates"][0]["digest"]
    again_smoked = run_cli([ENGINECTL, "smoke", vllm_entry, "--json"], env=env, timeout=1200)
    assert again_smoked.returncode == 0, again_smoked.stderr
    assert json.loads(again_smoked.stdout)["passed"] is True
    shown = json.loads(enginectl(env, "show", vllm_entry, "--json").stdout)
    assert [r["passed"] for r in shown["smoke_reports"]] == [True, True]
