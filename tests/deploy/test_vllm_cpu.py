"""From a real build to a real server on a deploy node, with vLLM's CPU build.

Once per module: `enginectl build` of the tiny recipe's CPU target (a real snapshot of the
tiny Llama, its vLLM entry, the smoke run on vLLM's CPU build: `ready`), then the builder's
work directories and its copy of the model are deleted. Then, as a deploy node:

- `enginectl pull --model tiny-llama --gpu cpu -o DIR`, and the command it printed, run as
  printed from another directory, answers a greedy completion equal to transformers' output;
- `enginectl serve` started as a subprocess answers, and a SIGTERM to it stops the server and
  everything it started.

Skipped without vLLM's CPU build or the model's libraries, failed instead under CI=true.
About four minutes on two cores (three vLLM starts).
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.serving.server import free_port
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import RECIPES, with_default_signals
from tests.models import make_tiny_model, offline_env, require
from tests.processes import TAG, process_titles, tagged_processes
from tests.smoke.transformers_reference import MAX_TOKENS, PROMPTS, transformers_greedy

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 900  # a guard against a hung server on a loaded machine, not a timing


@dataclass(frozen=True)
class Built:
    env: dict[str, str]  # the deploy node's: registry, store and cache, nothing else
    reference: list[str]  # transformers' greedy outputs of PROMPTS
    entry: str


@pytest.fixture(scope="module")
def built(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    require(("torch", "transformers", "tokenizers", "modelopt"), "the quantizer's libraries are")
    base = tmp_path_factory.mktemp("deploy-vllm")
    source = make_tiny_model(base / "builder-model", factory=tmp_path_factory)
    data = yaml.safe_load((RECIPES / "tiny-llama-cpu.yaml").read_text())
    data["model"]["source"] = str(source)
    data["quantize"]["calibration"]["file"] = str(RECIPES / "calibration" / "tiny.jsonl")
    recipe = base / "tiny-llama-cpu.yaml"
    recipe.write_text(yaml.safe_dump(data))
    home = base / "home"
    env = {k: v for k, v in offline_env().items() if not k.startswith("ENGINECTL_")}
    env.update(ENGINECTL_HOME=str(home), ENGINECTL_VLLM_PYTHON=str(vllm_python))
    done = run_cli([ENGINECTL, "build", str(recipe), "--only", "CPU/*", "--json"], env=env,
                   timeout=1800)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["failed"] == 0
    smoke = next(s for s in summary["stages"] if s["stage"] == "smoke")
    assert smoke["status"] == "built", summary  # passed: the entry is ready
    reference = transformers_greedy(source)
    shutil.rmtree(home / "work")  # the builder's work directories …
    shutil.rmtree(source)  # … and its model: a deploy node has the store alone
    return Built(env, reference, smoke["digest"])


def complete(port: int, prompt: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0, "ignore_eos": True})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v1/completions", body,
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def wait_generating(process: subprocess.Popen[str], port: int) -> None:
    """Until a completion succeeds (what readiness means here); fails if the process ends."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            status, _ = complete(port, "Hello")
            if status == 200:
                return
        except (OSError, ValueError):
            pass
        try:
            process.wait(timeout=0.5)  # the poll's pace, and it notices an exit
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"the server exited {process.returncode} before it generated")
    raise AssertionError("the server did not generate in time")


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started: whatever is still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def node_env(built: Built, tag: str) -> dict[str, str]:
    """What the deploy node's server runs with: no enginectl settings; a small KV cache (vLLM's
    CPU build otherwise claims 90 % of this shared machine's memory)."""
    env = {k: v for k, v in built.env.items() if not k.startswith("ENGINECTL_")}
    return {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", TAG: tag}


def test_the_printed_command_serves_what_transformers_decodes(
    built: Built, tmp_path: Path, stopped: list[subprocess.Popen[str]]
) -> None:
    dest = tmp_path / "models" / "tiny"
    port = free_port()
    done = run_cli([ENGINECTL, "pull", "--model", "tiny-llama", "--gpu", "cpu",
                    "-o", str(dest), "--host", "127.0.0.1", "--port", str(port)], env=built.env,
                   timeout=600)
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip()
    assert len(command.splitlines()) == 1
    assert json.loads((dest / "serve.json").read_text())["digest"] == built.entry
    assert (dest / "config.json").is_file()
    assert (dest / "tokenizer.json").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tag = uuid.uuid4().hex
    server = subprocess.Popen(shlex.split(command), cwd=elsewhere, env=node_env(built, tag),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True)
    stopped.append(server)
    wait_generating(server, port)
    outputs = []
    for prompt in PROMPTS:
        status, answer = complete(port, prompt)
        assert status == 200, answer
        outputs.append(answer["choices"][0]["text"])
    assert outputs == built.reference
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=READY_TIMEOUT_S)


def test_serve_answers_and_sigterm_stops_it_and_its_children(
    built: Built, tmp_path: Path, stopped: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    tag = uuid.uuid4().hex
    env = {**node_env(built, tag), "ENGINECTL_HOME": built.env["ENGINECTL_HOME"],
           "ENGINECTL_VLLM_PYTHON": built.env["ENGINECTL_VLLM_PYTHON"],
           # vLLM's default layout (tests/conftest.py turns it off): the worker in a process
           # of its own, beside the engine core
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    serve = subprocess.Popen(with_default_signals([
        ENGINECTL, "serve", "--model", "tiny-llama", "--gpu", "cpu", "--host", "127.0.0.1",
        "--port", str(port)]), cwd=tmp_path,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    stopped.append(serve)
    wait_generating(serve, port)
    status, answer = complete(port, PROMPTS[0])
    assert status == 200
    assert answer["choices"][0]["text"] == built.reference[0]
    titles = process_titles(tagged_processes(tag))  # enginectl, vLLM's server, its children
    assert any(title.startswith("VLLM::Worker") for title in titles), titles  # its own process
    serve.send_signal(signal.SIGTERM)  # to enginectl alone: it passes it on
    _, stderr = serve.communicate(timeout=READY_TIMEOUT_S)
    assert serve.returncode == 0, stderr  # vLLM shuts down cleanly on SIGTERM
    assert f"enginectl: serving {built.entry}" in stderr
    assert tagged_processes(tag) == []
