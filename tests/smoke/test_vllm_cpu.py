"""The harness against a real server: vLLM's CPU build (scripts/install-vllm) serving the tiny
Llama (scripts/make_tiny_model.py) with the argv a vLLM entry's manifest stores.

Skipped without the vLLM venv or the model's libraries, failed instead under CI=true. About a
minute per server start on two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipeline.recipe import Shape, SmokeSettings, VllmServe
from pipeline.smoke import SmokeReport, smoke
from pipeline.stages.serve import vllm_argv
from tests.smoke.conftest import TAG, TinyModels, offline_env, tagged_processes

pytestmark = pytest.mark.slow

SERVED_NAME = "tiny-llama"
PROMPTS = ["The capital of France is", "Write a haiku about GPUs."]
MAX_TOKENS = 8
SHAPE = Shape(max_batch_size=4, max_input_len=200, max_seq_len=256)

# Greedy decoding with transformers, one argmax at a time (no EOS handling, like ignore_eos),
# decoded as vLLM detokenizes completions: special tokens skipped.
TRANSFORMERS_GREEDY = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
texts = []
with torch.no_grad():
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        start = ids.shape[1]
        for _ in range(max_tokens):
            next_id = model(ids).logits[0, -1].float().argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        texts.append(tokenizer.decode(ids[0, start:], skip_special_tokens=True))
print(json.dumps(texts))
"""


def template(python: Path) -> list[str]:
    return vllm_argv(
        str(python), model_dir=Path("{model_dir}"), served_name=SERVED_NAME, dtype="bfloat16",
        quant="bf16", kv_cache_dtype="auto", prequantized=False, tp=1, pp=1, shape=SHAPE,
        settings=VllmServe(enforce_eager=True),
    )


def transformers_greedy(model_dir: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_GREEDY, str(model_dir), str(MAX_TOKENS), *PROMPTS],
        env=offline_env(), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    texts: list[str] = json.loads(proc.stdout)
    return texts


def serve(python: Path, model_dir: Path, tmp_path: Path, settings: SmokeSettings,
          reference: list[tuple[str, str]] | None = None) -> SmokeReport:
    tag = uuid.uuid4().hex
    report = smoke(
        template(python), model_dir=model_dir, served_name=SERVED_NAME, settings=settings,
        max_input_len=SHAPE.max_input_len, price_per_hour=1.0,
        log_path=tmp_path / "smoke.log", reference=reference,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1", TAG: tag},
    )
    assert tagged_processes(tag) == [], "the server left processes behind"
    return report


@pytest.fixture
def settings() -> SmokeSettings:
    return SmokeSettings(prompts=PROMPTS, max_tokens=MAX_TOKENS, concurrency=[1, 4],
                         requests=8, ready_timeout_s=600, request_timeout_s=120)


def test_vllm_serves_the_tiny_llama_as_transformers_decodes_it(
    vllm_python: Path, tiny_models: TinyModels, settings: SmokeSettings, tmp_path: Path
) -> None:
    expected = transformers_greedy(tiny_models.bf16)
    report = serve(vllm_python, tiny_models.bf16, tmp_path, settings,
                   reference=list(zip(PROMPTS, expected, strict=True)))
    print(json.dumps(report.as_dict(), indent=1))  # the numbers, for -s

    assert report.passed, f"{report.failure}\n{(tmp_path / 'smoke.log').read_text()[-3000:]}"
    greedy = report.check("greedy")
    assert greedy is not None
    assert [o["text"] for o in greedy.evidence["outputs"]] == expected
    assert greedy.evidence["ignore_eos"] == "accepted"
    long_prompt = report.check("long_prompt")
    assert long_prompt is not None
    assert long_prompt.evidence["counted_by"] == "/tokenize"
    assert SHAPE.max_input_len - 8 - 1 <= long_prompt.evidence["reported"] <= SHAPE.max_input_len
    assert [(level.concurrency, level.requests, level.errors, level.output_tokens)
            for level in report.load] == [(1, 8, 0, 64), (4, 8, 0, 64)]
    assert report.ready_s is not None
    assert report.best_output_tokens_per_s is not None
    assert report.cost_per_million_tokens is not None


def test_vllm_with_head_dim_16_is_up_but_cannot_generate(
    vllm_python: Path, tiny_models: TinyModels, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = serve(vllm_python, tiny_models.head_dim_16, tmp_path, settings)
    print(report.failure)  # for -s

    assert not report.passed
    assert report.ready_s is None
    assert report.load == []
    assert report.failure is not None
    assert report.failure.startswith("ready: ")
    assert "HTTP 500" in report.failure  # it listened, and its first generation failed
    ready = report.check("ready")
    assert ready is not None
    assert "head_dim" in (ready.evidence["cause"] or ""), ready.evidence["log_tail"]


