"""Fixtures for the smoke harness's tests.

    fake_argv                   the argv template of tests/fakes/openai_server.py (vLLM's
                                spelling), serving "fake-model" with max-model-len 512
    model_dir                   an empty directory the fake accepts as a model
    settings                    small SmokeSettings: 2 prompts, 4 tokens, concurrency [1, 3]
    tiny_models     (session)   scripts/make_tiny_model.py's bf16 Llama (head_dim 64) and its
                                head_dim 16 variant; needs torch, transformers and tokenizers

vllm_python (scripts/install-vllm's python) is the root conftest's; the fake server's names
and `tagged_processes` are in tests/processes.py, making models in tests/models.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.recipe.schema import SmokeSettings
from tests.models import TinyModels, make_tiny_model, require
from tests.processes import FAKE_MAX_MODEL_LEN, FAKE_NAME, FAKE_SERVER


@pytest.fixture
def fake_argv() -> list[str]:
    return [sys.executable, str(FAKE_SERVER), "--model", "{model_dir}", "--host", "127.0.0.1",
            "--port", "{port}", "--served-model-name", FAKE_NAME,
            "--max-model-len", str(FAKE_MAX_MODEL_LEN), "--enforce-eager"]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    return path


@pytest.fixture
def settings() -> SmokeSettings:
    return SmokeSettings(prompts=["The capital of France is", "Write a haiku about GPUs."],
                         max_tokens=4, concurrency=[1, 3], requests=5, ready_timeout_s=60,
                         request_timeout_s=30)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    require(("torch", "transformers", "tokenizers"), "the vLLM smoke test is")
    root = tmp_path_factory.mktemp("models")
    made = TinyModels(root / "tiny-llama", root / "tiny-llama-hd16")
    make_tiny_model(made.bf16, factory=tmp_path_factory)
    make_tiny_model(made.head_dim_16, "--head-dim", "16", factory=tmp_path_factory)
    return made
