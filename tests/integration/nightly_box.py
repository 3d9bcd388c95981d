"""The nightly's toy: one builder box (its home, an "H100" from the nvidia-smi stand-in, its
driver to bump, the CLI) with the toy recipe, and what a test reads from the nightly's report.
The built box is the `box` fixture (conftest)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import builder_env, expect_exit, fake_gpu
from tests.integration.builds import make_model

OLD, NEW, NEWER = "570.124.06", "575.57.08", "580.65.06"
ENGINE_TARGET = "H100-SXM5-80GB/tp1/pp1/bf16/kv-auto/small/trtllm"
ENGINE_ALIAS = "toy/h100-sxm5-80gb/trtllm"
CHECKPOINT_ALIAS = "toy/h100-sxm5-80gb/trtllm-pytorch"


def write_recipe(directory: Path, max_regression: float, gate_rounds: int = 1) -> Path:
    """The toy recipe; one gate round unless a test weighs the gate's numbers (a round serves
    both engines once). A test that weighs no gate or alarm numbers asks for max_regression
    0.99 (a candidate 100x slower), which no load on the machine reaches."""
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": [
            {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}]},
        "serve": {"trtllm": {}, "trtllm-pytorch": {}},
        "smoke": {"prompts": ["The capital of France is"], "max_tokens": 4,
                  "concurrency": [1, 2], "requests": 4, "ready_timeout_s": 60,
                  "request_timeout_s": 60},
        "promote": [{"alias": "toy/{gpu}/{runtime}", "max_regression": max_regression}],
        "nightly": {"max_regression": max_regression, "gate_rounds": gate_rounds},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


class Box:
    """One builder box: its home, its GPU (the stand-in's config) and the CLI."""

    def __init__(self, tmp_path: Path, registry_url: str, *, max_regression: float,
                 gate_rounds: int = 1) -> None:
        self.recipe = write_recipe(tmp_path / "recipes", max_regression, gate_rounds)
        self.gpu = fake_gpu(tmp_path / "gpu", driver=OLD)
        self.registry_url = registry_url
        self.env = {**builder_env(tmp_path, registry_url), **self.gpu}
        self.cwd = tmp_path

    def bump(self, driver: str) -> None:
        fake_gpu(Path(self.gpu["FAKE_NVIDIA_SMI_CONFIG"]).parent, driver=driver)

    def run(self, *args: str, code: int = 0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = run_cli([ENGINECTL, *args], env={**self.env, **(env or {})}, timeout=600,
                       cwd=self.cwd)
        expect_exit(done, code)
        return done

    def nightly(self, *args: str, code: int = 0, **env: str) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(
            self.run("nightly", "--json", *args, code=code, env=env).stdout)
        return report


def target(report: dict[str, Any], target_id: str) -> dict[str, Any]:
    found = [t for r in report["recipes"] for t in r["targets"] if t["id"] == target_id]
    assert len(found) == 1, report
    return found[0]
