"""One smoke verdict (pipeline.serving.verdict): `enginectl smoke REF` judges a quantized
entry with its recipe's reference outputs and agreement threshold, as the build's smoke did.

A real FP8 quantization of the tiny Llama (modelopt), a TRT-LLM PyTorch-backend entry for
an H100, served by TensorRT-LLM's stand-ins (tests/fakes) on a stand-in H100.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from tests.helpers import RECIPES, builder_env, fake_gpu
from tests.helpers import enginectl as cli

TINY_CALIBRATION = "sha256:ea0b824c6c8ec24032650dc017cf54f96e261291c4312014c3e877adc3a8ec7c"


def test_a_quantized_entry_that_disagrees_with_its_references_fails_both_smokes(
        tiny_model: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_model, tmp_path / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["fp8"],
                   "shape": [{"name": "small", "max_batch_size": 4, "max_input_len": 128,
                              "max_seq_len": 256}]},
        "serve": {"trtllm-pytorch": {}},
        "quantize": {"calibration": {"file": str(RECIPES / "calibration" / "tiny.jsonl"),
                                     "digest": TINY_CALIBRATION, "samples": 4, "seq_len": 32}},
        "smoke": {"prompts": ["The capital of France is"], "max_tokens": 4,
                  "concurrency": [1], "requests": 1, "reference_agreement": 0.9,
                  "reference": [{"prompt": "The capital of France is",
                                 "output": " nowhere near any of it"}]},
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**builder_env(tmp_path, f"sqlite:///{tmp_path / 'registry.db'}"),
           **fake_gpu(tmp_path / "gpu")}
    built = cli(env, "build", path, "--json", code=5)
    (entry,) = [s["digest"] for s in json.loads(built.stdout)["stages"]
                if s["stage"] == "smoke"]
    first = json.loads(cli(env, "show", entry, "--json").stdout)
    assert first["artifact"]["status"] == "quarantined"
    build_failure = first["smoke_reports"][-1]["report"]["failure"]
    assert build_failure.startswith("reference: ")

    done = cli(env, "smoke", entry, code=5)  # the same references, the same threshold
    again = json.loads(cli(env, "show", entry, "--json").stdout)
    assert again["artifact"]["status"] == "quarantined"
    assert again["smoke_reports"][-1]["report"]["failure"] == build_failure
    assert "reference: " in done.stdout + done.stderr
