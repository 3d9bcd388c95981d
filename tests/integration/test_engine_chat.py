"""A compiled engine answers chat wherever it is served (issue 22): trtllm-serve 1.2 loads the
model config from its --tokenizer path with transformers' AutoConfig, so an engine is served
with a tokenizer directory holding the source model's HF config.json, tokenizer files and chat
template, published inside it.

Everything runs as a user runs it: `enginectl build` on TensorRT-LLM's stand-ins (which load
the tokenizer and model config with transformers, as 1.2 does) with a stand-in H100, `pull`
and `import` from the CLI, and the server started from serve.json's argv.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import BuildSettings
from pipeline.serving.server import free_port
from pipeline.stages.build import build_argv, build_flags
from pipeline.stages.convert import convert_argv
from registry.sql.db import open_registry
from registry.sql.records import get_artifact, list_artifacts
from tests.helpers import FAKES, builder_env, fake_gpu
from tests.helpers import enginectl as cli

SHAPE = {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}
START_TIMEOUT_S = 120


@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    """A builder on the stand-ins with one (stand-in) H100: its build smokes engines."""
    return {**builder_env(tmp_path, registry_url), **fake_gpu(tmp_path / "gpu")}




def write_recipe(directory: Path, model: Path) -> Path:
    shutil.copytree(model, directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": [SHAPE]},
        "serve": {"trtllm": {}},
        "smoke": {"prompts": ["The capital of France is"], "max_tokens": 4,
                  "concurrency": [1], "requests": 2, "ready_timeout_s": START_TIMEOUT_S,
                  "request_timeout_s": 60},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def engine_dir(root: Path, model: Path) -> Path:
    """An engine directory as TensorRT-LLM makes one outside enginectl (convert, then
    trtllm-build, through the stand-ins): no tokenizer directory in it."""
    checkpoint, engine = root / "checkpoint", root / "engine"
    root.mkdir(parents=True, exist_ok=True)  # trtllm-build writes model.cache in its cwd
    shape = Shape(max_batch_size=4, max_input_len=256, max_seq_len=512)
    flags = build_flags(BuildSettings(), shape, "bf16", "auto", tp=1, family="llama")
    build = build_argv(checkpoint_dir=checkpoint, output_dir=engine, flags=flags, workers=1)
    convert = convert_argv(sys.executable, FAKES / "examples", family="llama", model_dir=model,
                           output_dir=checkpoint, dtype="bfloat16", tp=1, pp=1, workers=1)
    for argv in (convert, [sys.executable, str(FAKES / "bin" / "trtllm-build"), *build[1:]]):
        subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=root)
    return engine


def request(port: int, method: str, path: str,
            body: dict[str, Any] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
        return answer.status, json.loads(data) if data else None
    finally:
        connection.close()


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Servers a test starts; each one's process group is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def serve_from(serve_json: Path, cwd: Path, env: dict[str, str],
               servers: list[subprocess.Popen[bytes]]) -> int:
    """Run serve.json's argv from *cwd* as a deploy tool would; its port once it answers."""
    data = json.loads(serve_json.read_text())
    with (cwd / "server.log").open("wb") as log:
        process = subprocess.Popen(data["argv"], cwd=cwd, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    servers.append(process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if request(data["port"], "GET", "/health")[0] == 200:
                return int(data["port"])
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"the server did not answer: {(cwd / 'server.log').read_text()}")


def chat(port: int) -> str:
    status, body = request(port, "POST", "/v1/chat/completions", {
        "model": "toy", "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": 4})
    assert status == 200, body
    content: str = body["choices"][0]["message"]["content"]
    assert content
    return content


def without_model_names(path: Path) -> Path:
    """*path*, checked to hold none of the names transformers' AutoConfig falls back to
    (`llama` in a path makes any config.json a LlamaConfig): the test means the engine dir."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    found = [name for name in CONFIG_MAPPING if name in str(path)]
    assert not found, f"{path} holds model names {found}; AutoConfig would take one"
    return path


def test_a_built_engine_is_smoked_with_chat_pulled_and_served_from_elsewhere(
    env: dict[str, str], tmp_path: Path, registry_url: str, tiny_model: Path,
    servers: list[subprocess.Popen[bytes]],
) -> None:
    recipe = write_recipe(tmp_path / "recipes", tiny_model)
    cli(env, "build", recipe, "--json")
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        (engine,) = list_artifacts(session, kind="trtllm-engine")
        assert engine.status == "ready", engine.status_reason  # smoke passed, chat included
        files = {f.path for f in engine.files}
    assert {"tokenizer/config.json", "tokenizer/tokenizer.json",
            "tokenizer/tokenizer_config.json"} <= files
    shown = json.loads(cli(env, "show", engine.digest, "--json").stdout)
    argv = shown["manifest"]["serve"]["argv"]
    assert argv[argv.index("--tokenizer") + 1] == "{model_dir}/tokenizer"

    pulled = tmp_path / "node" / "models"
    port = free_port()
    cli(env, "pull", engine.digest, "-o", pulled, "--host", "127.0.0.1", "--port", str(port))
    serve_json = json.loads((pulled / "serve.json").read_text())
    assert serve_json["tokenizer_dir"] == str(pulled / "tokenizer")
    argv = serve_json["argv"]
    assert argv[argv.index("--tokenizer") + 1] == str(pulled / "tokenizer")
    hf_config = json.loads((pulled / "tokenizer" / "config.json").read_text())
    assert hf_config["model_type"] == "llama"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert chat(serve_from(pulled / "serve.json", elsewhere, env, servers))


def test_the_stand_in_refuses_an_engine_dir_as_tokenizer_as_trtllm_serve_does(
    env: dict[str, str], tmp_path: Path, tiny_model: Path
) -> None:
    """1.2's OpenAIServer loads the model config from the tokenizer path: an engine's
    config.json (TRT-LLM's) gives AutoConfig no model_type, model_config stays None, and the
    server dies reading its model_type. Without a config.json the server does not start
    either. (The engine holds the tokenizer files, as builds before this change left them.)"""
    engine = without_model_names(engine_dir(tmp_path / "e", tiny_model))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).is_file():
            shutil.copy2(tiny_model / name, engine / name)
    base = [str(FAKES / "bin" / "trtllm-serve"), str(engine), "--backend", "tensorrt",
            "--host", "127.0.0.1", "--port", str(free_port()), "--max_seq_len", "512"]
    refused = subprocess.run([*base, "--tokenizer", str(engine)], env=env, text=True,
                             capture_output=True, timeout=START_TIMEOUT_S, check=False)
    assert refused.returncode == 1
    assert "AttributeError: 'NoneType' object has no attribute 'model_type'" in refused.stdout
    no_config = tmp_path / "tokenizer-only"
    shutil.copytree(tiny_model, no_config, ignore=shutil.ignore_patterns("config.json",
                                                                         "*.safetensors"))
    missing = subprocess.run([*base, "--tokenizer", str(no_config)], env=env, text=True,
                             capture_output=True, timeout=START_TIMEOUT_S, check=False)
    assert missing.returncode == 1
    assert "config.json" in missing.stdout


def test_an_engine_imported_without_its_tokenizer_is_never_proven_and_says_how(
    env: dict[str, str], tmp_path: Path, registry_url: str, tiny_model: Path,
    servers: list[subprocess.Popen[bytes]],
) -> None:
    engine = engine_dir(tmp_path / "built-elsewhere", tiny_model)
    spec: list[str | Path] = ["import", engine, "--kind", "trtllm-engine", "--model", "toy",
                              "--gpu", "h100"]

    bare = cli(env, *spec, "--json")
    digest = json.loads(bare.stdout)["digest"]
    (said,) = [line for line in bare.stderr.splitlines() if "tokenizer" in line]
    assert said.startswith("enginectl: note: ")
    assert "cannot serve chat" in said
    assert "--tokenizer-from" in said
    refused = cli(env, "smoke", digest, code=2)
    assert "cannot serve chat" in refused.stderr
    assert "--tokenizer-from" in refused.stderr
    wrong = cli(env, *spec, "--tokenizer-from", engine, code=2)
    assert "no model_type" in wrong.stderr
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        record = get_artifact(session, digest)
        assert record is not None
        assert record.status == "built"  # never smoked into ready

    with_dir = json.loads(cli(env, *spec, "--tokenizer-from", tiny_model, "--json").stdout)
    assert with_dir["digest"] != digest
    cli(env, "smoke", with_dir["digest"])  # proven with a chat request, on the stand-in H100
    checkpoint = json.loads(cli(env, "import", tiny_model, "--kind", "hf-checkpoint", "--model",
                                "toy", "--json").stdout)["digest"]
    by_ref = json.loads(cli(env, *spec, "--tokenizer-from", checkpoint, "--json").stdout)
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        proven = get_artifact(session, with_dir["digest"])
        assert proven is not None
        assert proven.status == "ready"
    shown = json.loads(cli(env, "show", by_ref["digest"], "--json").stdout)["manifest"]
    assert shown["inputs"] == [checkpoint]  # the REF is its provenance
    assert "tokenizer/config.json" in {f["path"] for f in shown["files"]}

    for digest_of in (with_dir["digest"], by_ref["digest"]):
        pulled = tmp_path / f"node-{digest_of[7:15]}"
        cli(env, "pull", digest_of, "-o", pulled, "--host", "127.0.0.1",
            "--port", str(free_port()), "--allow-unready")
        assert chat(serve_from(pulled / "serve.json", tmp_path, env, servers))
