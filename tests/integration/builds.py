"""A builder on TensorRT-LLM's stand-ins (tests/fakes): the toy model and recipes it builds, and
`enginectl build` and `smoke` run as a user runs them, in the foreground or as a process to
kill, with what a test reads from their output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from registry.sql import leases, records
from registry.sql.db import open_registry
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import with_default_signals
from tests.tokenizer_files import write_tokenizer


def make_model(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
              "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 4096, "rope_theta": 10000.0}
    (root / "config.json").write_text(json.dumps(config))
    write_weights(root / "model.safetensors")  # what convert's stand-in splits into ranks
    write_tokenizer(root)  # one transformers loads: trtllm-serve renders chat with it
    return root


def write_weights(path: Path, size: int = 4096) -> None:
    """A safetensors file of four random tensors, *size* bytes of weights in all."""
    from tests.fakes.weights import write_safetensors

    names = ("lm_head.weight", "model.embed_tokens.weight",
             "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight")
    write_safetensors(path, {name: ("U8", [size // 4], os.urandom(size // 4)) for name in names})


def write_recipe(directory: Path, **matrix: object) -> Path:
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": [
            {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
            {"name": "wide", "max_batch_size": 16, "max_input_len": 256, "max_seq_len": 512},
        ], **matrix},
        "serve": {"trtllm": {}, "vllm": {}},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def build(env: dict[str, str], recipe: Path, *args: str,
          code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, "build", str(recipe), *args], env=env, timeout=600)
    assert done.returncode == code, (done.stdout, done.stderr)
    return done


SMALL_ENGINE = "*/small/trtllm"


def start(env: dict[str, str], recipe: Path, *args: str) -> subprocess.Popen[str]:
    """A builder in a session of its own (so that killpg reaches it and nothing else), its
    signals at their defaults (the tests send it some)."""
    return subprocess.Popen(with_default_signals([ENGINECTL, "build", str(recipe), *args]),
                            env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def wait_for_pidfile(proc: subprocess.Popen[str], pidfile: Path) -> int:
    """The pid the hanging trtllm-build stand-in writes once it runs (its builder holds the
    engine's lease by then)."""
    deadline = time.monotonic() + 300
    while not pidfile.exists() or not pidfile.read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return int(pidfile.read_text())


def waiting_for_the_engine(proc: subprocess.Popen[str]) -> None:
    """Read a builder's lines until it has reused the convert run: it is then at the engine,
    whose lease another builder holds."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("reused  convert"):
            return
    raise AssertionError(f"the second builder ended first: {proc.communicate()}")


def counts(stdout: str) -> dict[str, int]:
    """{"built": N, "reused": N, ...} from a build's summary line."""
    found = re.search(r"^built (\d+), reused (\d+), failed (\d+), skipped (\d+);", stdout,
                      re.MULTILINE)
    assert found is not None, stdout
    return dict(zip(("built", "reused", "failed", "skipped"), map(int, found.groups()),
                    strict=True))


def smoke(env: dict[str, str], ref: str, *args: str,
          code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, "smoke", ref, *args], env=env, timeout=600)
    assert done.returncode == code, (done.stdout, done.stderr)
    if code:
        (line,) = done.stderr.splitlines()
        assert line.startswith("enginectl: error: ")
    return done


def cpu_recipe(directory: Path) -> Path:
    """The toy model as a vLLM entry on the CPU: snapshot, entry, smoke."""
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["cpu"], "shape": [
            {"name": "s", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128}]},
        "serve": {"vllm": {}},
    }
    path = directory / "cpu.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


GUARD_S = 300  # against a hung builder, not a timing assertion


def engine_key(env: dict[str, str], recipe: Path) -> str:
    plan = json.loads(build(env, recipe, "--dry-run", "--json", "--only", SMALL_ENGINE).stdout)
    return str(next(s["key"] for s in plan["stages"] if s["kind"] == "trtllm-engine"))


def lease_of(registry_url: str, key: str) -> leases.StageRunRecord:
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        found = leases.get_stage_run(session, key)
    assert found is not None
    return found


def engines(registry_url: str) -> list[records.ArtifactRecord]:
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        return records.list_artifacts(session, kind="trtllm-engine")


def take_over(registry_url: str, key: str, *, owner: str, host: str, pid: int) -> None:
    """Take *key*'s running lease away from its holder as another builder does that finds it
    expired (`leases.try_acquire_lease`, asked as if ten years had passed)."""
    later = datetime.now(UTC) + timedelta(days=3650)
    with open_registry(registry_url) as registry, registry.session() as session:
        assert leases.try_acquire_lease(session, key, owner=owner, host=host, pid=pid,
                                        ttl_s=3600.0, now=later)
