"""Fixtures for the smoke harness's tests.

    fake_argv                   the argv template of tests/fakes/openai_server.py (vLLM's
                                spelling), serving "fake-model" with max-model-len 512
    model_dir                   an empty directory the fake accepts as a model
    settings                    small SmokeSettings: 2 prompts, 4 tokens, concurrency [1, 3]
    vllm_python     (session)   scripts/install-vllm's python; the tests that need it skip
                                without it, and fail instead under CI=true
    tiny_models     (session)   scripts/make_tiny_model.py's bf16 Llama (head_dim 64) and its
                                head_dim 16 variant; needs torch, transformers and tokenizers

tagged_processes(tag) lists the live processes whose environment has TAG=tag: a test puts a
fresh tag in a server's env and checks that nothing it started outlives the harness.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from pipeline.recipe import SmokeSettings
from tests.helpers import ROOT

FAKE_SERVER = ROOT / "tests" / "fakes" / "openai_server.py"
FAKE_NAME = "fake-model"
FAKE_MAX_MODEL_LEN = 512
MODEL_TIMEOUT_S = 600
TAG = "ENGINECTL_SMOKE_TEST_TAG"  # put in a server's environment, inherited by all it starts


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the vLLM smoke test is required)")
    pytest.skip(reason)


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
def vllm_python() -> Path:
    proc = subprocess.run([str(ROOT / "scripts" / "install-vllm"), "--check"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        unavailable(proc.stderr.strip() or "vLLM's CPU build is not installed; "
                    "run scripts/install-vllm")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class TinyModels:
    bf16: Path
    head_dim_16: Path


def offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    missing = [name for name in ("torch", "transformers", "tokenizers")
               if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed; run scripts/install-quantize")
    root = tmp_path_factory.mktemp("models")
    made = TinyModels(root / "tiny-llama", root / "tiny-llama-hd16")
    for out, extra in ((made.bf16, []), (made.head_dim_16, ["--head-dim", "16"])):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(out), *extra],
            cwd=ROOT, env=offline_env(), capture_output=True, text=True,
            timeout=MODEL_TIMEOUT_S, check=False,
        )
        assert proc.returncode == 0, f"make_tiny_model.py failed:\n{proc.stderr}"
    return made


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries TAG=tag: the server and all it started."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
