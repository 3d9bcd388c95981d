"""The nightly end to end on CPU, as issue 12 asks: the tiny Llama (scripts/make_tiny_model.py)
built with an engine target and a TRT-LLM PyTorch entry on an "H100" (the nvidia-smi stand-in
and TensorRT-LLM's stand-ins), a real modelopt FP8 quantization, and its vLLM CPU entry served
for real (scripts/install-vllm). A nightly finds nothing to do; the stand-in's driver is
bumped; the next nightly runs exactly the driver-dependent keys (the engine is rebuilt, the
checkpoint and vLLM entries re-smoked; snapshot, quantize and convert reused), moves the
engine's alias, supersedes the old engine and names both driver versions; a third does nothing.

Skipped without the quantizer's libraries or vLLM's CPU build, failed instead under CI=true.
A few minutes on two cores (two vLLM server starts); the faster nightly tests, with stand-ins
only, are tests/integration/test_nightly.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from registry.sql.alias_records import get_alias
from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import FAKES, RECIPES, ROOT, fake_gpu
from tests.integration.db_fixtures import postgres_url

__all__ = ["postgres_url"]  # the fixture: a fresh PostgreSQL schema

pytestmark = pytest.mark.slow

OLD, NEW = "570.124.06", "575.57.08"
CALIBRATION = RECIPES / "calibration" / "tiny.jsonl"
CALIBRATION_DIGEST = "sha256:ea0b824c6c8ec24032650dc017cf54f96e261291c4312014c3e877adc3a8ec7c"
ENGINE = "H100-SXM5-80GB/tp1/pp1/bf16/kv-auto/tiny/trtllm"
CHECKPOINT = "H100-SXM5-80GB/tp1/pp1/fp8/kv-auto/tiny/trtllm-pytorch"
VLLM = "CPU/tp1/pp1/bf16/kv-auto/tiny/vllm"


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the nightly end to end test is required)")
    pytest.skip(reason)


def vllm_python() -> str:
    missing = [name for name in ("torch", "transformers", "tokenizers", "modelopt")
               if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed; run scripts/install-quantize")
    proc = subprocess.run([str(ROOT / "scripts" / "install-vllm"), "--check"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        unavailable(proc.stderr.strip() or "vLLM's CPU build is missing; run "
                    "scripts/install-vllm")
    return proc.stdout.strip().splitlines()[-1]


def write_recipe(directory: Path) -> Path:
    model = directory / "tiny-llama"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"),
                           str(model)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    recipe = {
        "name": "tiny-nightly",
        "model": {"name": "tiny-llama", "source": str(model), "dtype": "bfloat16"},
        "matrix": {
            "gpu": ["h100"], "quant": ["bf16", "fp8"],
            "shape": [{"name": "tiny", "max_batch_size": 4, "max_input_len": 128,
                       "max_seq_len": 256}],
            "exclude": [{"quant": "fp8", "runtime": "trtllm"},
                        {"quant": "bf16", "runtime": "trtllm-pytorch"}, {"runtime": "vllm"}],
            "include": [{"gpu": "cpu", "quant": "bf16", "runtime": "vllm"}],
        },
        "quantize": {"calibration": {"file": str(CALIBRATION), "digest": CALIBRATION_DIGEST,
                                     "samples": 16, "seq_len": 64}},
        "serve": {"trtllm": {}, "trtllm-pytorch": {}, "vllm": {"enforce_eager": True}},
        "smoke": {"max_tokens": 8, "concurrency": [1, 2], "requests": 4,
                  "gpu_price_per_hour": {"cpu": 0.10}},
        # generous: CPU timings are noisy; the gate itself is tested with a 20x slower server
        "promote": [{"alias": "tiny/{gpu}/{runtime}", "max_regression": 0.9}],
        # the alarm compares with a proof of another run: only a 100x drop, whatever the load
        "nightly": {"max_regression": 0.99},  # the alarm: tested with a 20x slower server
    }
    path = directory / "tiny-nightly.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def stages_run(report: dict[str, Any]) -> dict[str, list[str]]:
    return {t["id"]: [s["stage"] for s in t["stages"]]
            for r in report["recipes"] for t in r["targets"]}


def test_nightly_requalifies_exactly_what_a_driver_bump_invalidates(
        tmp_path: Path, postgres_url: str) -> None:
    python = vllm_python()
    recipe = write_recipe(tmp_path)
    gpu = fake_gpu(tmp_path / "gpu", driver=OLD)
    env = {**os.environ, **gpu, "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "ENGINECTL_HOME": str(tmp_path / "home"), "ENGINECTL_REGISTRY_URL": postgres_url,
           "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
           "ENGINECTL_PYTHON": sys.executable, "ENGINECTL_VLLM_PYTHON": python,
           "HF_HUB_OFFLINE": "1"}

    def enginectl(*args: str) -> dict[str, Any]:
        done = run_cli([ENGINECTL, *args, "--json"], env=env, timeout=1800)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        value: dict[str, Any] = json.loads(done.stdout)
        return value

    built = enginectl("build", str(recipe))
    assert built["smoke_failed"] == built["pending_smoke"] == built["failed"] == 0
    with open_registry(postgres_url) as registry, registry.session() as session:
        old_engine = get_alias(session, "tiny/h100-sxm5-80gb/trtllm")
        checkpoint = get_alias(session, "tiny/h100-sxm5-80gb/trtllm-pytorch")
        vllm_entry = get_alias(session, "tiny/cpu/vllm")
    assert old_engine
    assert checkpoint
    assert vllm_entry

    assert enginectl("nightly")["nothing_changed"]

    fake_gpu(tmp_path / "gpu", driver=NEW)
    report = enginectl("nightly")
    assert report["exit_code"] == 0
    assert report["pools"][0]["changes"] == [  # the CUDA the driver runs moves with its branch
        {"field": "driver", "old": OLD, "new": NEW},
        {"field": "driver_cuda", "old": "12.8", "new": "12.9"}]
    assert stages_run(report) == {ENGINE: ["build", "smoke"], CHECKPOINT: ["smoke"],
                                  VLLM: ["smoke"]}  # snapshot, quantize, convert reused
    verdicts = {t["id"]: t["verdict"] for r in report["recipes"] for t in r["targets"]}
    # the engine is rebuilt and its alias moved; the entries keep their digests
    assert verdicts == {ENGINE: "promoted", CHECKPOINT: "re-proved", VLLM: "re-proved"}
    assert OLD in report["text"]
    assert NEW in report["text"]
    with open_registry(postgres_url) as registry, registry.session() as session:
        new_engine = get_alias(session, "tiny/h100-sxm5-80gb/trtllm")
        assert new_engine not in (None, old_engine)
        assert get_alias(session, "tiny/h100-sxm5-80gb/trtllm-pytorch") == checkpoint
        assert get_alias(session, "tiny/cpu/vllm") == vllm_entry
        statuses = {a.digest: a.status for a in list_artifacts(session, kind="trtllm-engine")}
        assert statuses == {old_engine: "superseded", new_engine: "ready"}
        assert len(list_artifacts(session, kind="quantized-checkpoint")) == 1

    assert enginectl("nightly")["nothing_changed"]
