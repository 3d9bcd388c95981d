"""Weight-stripped engines through `enginectl build` and `pull` on TensorRT-LLM's stand-ins:
the smoke serves the engine refitted from its checkpoint, the first stripped engine of a
(model, quant, TRT-LLM) on a GPU is also built whole and compared (`refit-equivalence`
evidence), and an engine without evidence that holds stays `built`; a refit that fails
quarantines it. `pull` fetches the plan and the checkpoint (through the fetch cache), refits
on the node, keeps the refitted engine for the next pull, and fails whole (exit 3) when the
refit does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from registry.sql.db import open_registry
from registry.sql.records import ArtifactRecord, list_artifacts, mark_deleted
from tests.fakes.weights import read_engine
from tests.helpers import FAKES, builder_env, fake_gpu, only_nvidia_smi
from tests.helpers import enginectl as cli
from tests.integration.builds import make_model

SHAPES = [{"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
          {"name": "wide", "max_batch_size": 16, "max_input_len": 256, "max_seq_len": 512}]
STEADY = {"FAKE_OPENAI_TOKEN_DELAY_S": "0.01"}  # speed set by the stand-in, not the machine
SQLITE = pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)


@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    return {**builder_env(tmp_path, registry_url), **fake_gpu(tmp_path / "gpu"), **STEADY,
            "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"),
            "FAKE_TRTLLM_REFIT_LOG": str(tmp_path / "refits.jsonl")}


def blobs(record: ArtifactRecord) -> dict[str, int]:
    return {str(f.xxh3): f.size for f in record.files}


def refits(tmp_path: Path) -> int:
    log = tmp_path / "refits.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def pulled(env: dict[str, str], digest: str, dest: Path, code: int = 0) -> dict[str, Any]:
    done = cli(env, "pull", digest, "-o", dest, "--json", code=code)
    return json.loads(done.stdout) if code == 0 else {"stderr": done.stderr}


def stripped_recipe(directory: Path, shapes: list[dict[str, Any]]) -> Path:
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": shapes},
        "build": {"strip_plan": True},
        "serve": {"trtllm": {}},
        "smoke": {"prompts": ["The capital of France is", "One two three"], "max_tokens": 4,
                  "concurrency": [1], "requests": 4, "ready_timeout_s": 120,
                  "request_timeout_s": 60},
        "nightly": {"gate_rounds": 1},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def artifacts(url: str, kind: str) -> list[ArtifactRecord]:
    with open_registry(url) as registry, registry.session(readonly=True) as session:
        return list_artifacts(session, kind=kind)


@SQLITE
def test_stripped_engines_smoke_refitted_and_the_first_is_compared_whole(
        tmp_path: Path, env: dict[str, str], registry_url: str) -> None:
    recipe = stripped_recipe(tmp_path / "r", SHAPES)
    cli(env, "build", recipe)
    engines = artifacts(registry_url, "trtllm-engine")
    (checkpoint,) = artifacts(registry_url, "converted-checkpoint")
    assert [e.status for e in engines] == ["ready", "ready"]
    for engine in engines:
        assert engine.labels["strip_plan"] is True
        assert engine.labels["refit_source"] == checkpoint.digest
        ranks = [f for f in engine.files if f.path.endswith(".engine")]
        weights = sum(f.size for f in checkpoint.files if f.path.endswith(".safetensors"))
        assert sum(f.size for f in ranks) < weights  # the plan carries none of them
    (evidence,) = artifacts(registry_url, "refit-equivalence")  # once for the tuple
    assert evidence.status == "ready"
    assert evidence.labels == {"model": "toy", "quant": "bf16", "gpu": "H100-SXM5-80GB"}
    assert evidence.toolchain["trtllm"] == "1.2.1"
    shown = cli(env, "show", engines[0].digest).stdout
    assert "refit-equivalence" in shown
    assert evidence.digest[:19] in shown
    compared = cli(env, "compare", "--model", "toy").stdout
    assert f"refit-equivalence {evidence.digest[:19]}" in compared
    pull_each_shape(tmp_path, env, engines, checkpoint)
    gc_and_fsck_keep_the_refit_source(tmp_path, env, registry_url, engines[0], checkpoint)


def pull_each_shape(tmp_path: Path, env: dict[str, str], engines: list[ArtifactRecord],
                    checkpoint: ArtifactRecord) -> None:
    """A fresh node pulls one shape, then the other, then the first again."""
    node = {**env, "ENGINECTL_CACHE_DIR": str(tmp_path / "node-cache")}
    before = refits(tmp_path)
    first = pulled(node, engines[0].digest, tmp_path / "a")
    plan, source = blobs(engines[0]), blobs(checkpoint)
    assert first["downloaded_bytes"] == sum({**plan, **source}.values())
    assert first["refit"]["checkpoint_downloaded_bytes"] == sum(
        size for blob, size in source.items() if blob not in plan)  # the tokenizer is shared
    assert first["refit"]["seconds"] is not None
    serve = json.loads((tmp_path / "a" / "serve.json").read_text())
    assert serve["refit"]["checkpoint"] == checkpoint.digest
    assert serve["argv"][:2] == ["trtllm-serve", str(tmp_path / "a")] or \
        serve["argv"][1] == str(tmp_path / "a")
    header, body = read_engine(tmp_path / "a" / "rank0.engine")
    assert header["stripped"] is False
    assert len(body) == sum(w["size"] for w in header["weights"].values()) > 0  # its weights
    second = pulled(node, engines[1].digest, tmp_path / "b")  # the other shape
    assert second["refit"]["checkpoint_downloaded_bytes"] == 0  # the checkpoint was here
    assert second["downloaded_bytes"] == sum(
        size for blob, size in blobs(engines[1]).items() if blob not in {**plan, **source})
    assert refits(tmp_path) == before + 2
    again = pulled(node, engines[0].digest, tmp_path / "a")  # a restart: no refit again
    assert again["refit"]["seconds"] is None
    assert again["downloaded_bytes"] == 0
    assert refits(tmp_path) == before + 2
    kept = (tmp_path / "a" / "rank0.engine").read_bytes()
    shutil.rmtree(tmp_path / "node-cache" / "refits")  # a refit that fails: DIR keeps it all
    failed = pulled({**node, "FAKE_TRTLLM_REFIT_FAIL": "RuntimeError: Failed to refit "
                     "engine."}, engines[0].digest, tmp_path / "a", code=3)
    assert "Failed to refit engine" in failed["stderr"]
    assert (tmp_path / "a" / "rank0.engine").read_bytes() == kept
    cli(env, "smoke", engines[0].digest)  # `enginectl smoke` serves it refitted too


@SQLITE
def test_a_refit_that_serves_otherwise_holds_the_engine_built(
        tmp_path: Path, env: dict[str, str], registry_url: str) -> None:
    recipe = stripped_recipe(tmp_path / "r", SHAPES[:1])
    cli({**env, "FAKE_TRTLLM_REFIT_ZEROS": "1"}, "build", recipe)
    (engine,) = artifacts(registry_url, "trtllm-engine")
    (evidence,) = artifacts(registry_url, "refit-equivalence")
    assert evidence.status == "quarantined"
    assert "greedy output differs" in (evidence.status_reason or "")
    assert engine.status == "built"
    assert "refit-equivalence of toy bf16 with TensorRT-LLM 1.2.1" in (engine.status_reason or "")
    said = cli(env, "pull", engine.digest, "-o", tmp_path / "dir", code=4).stderr
    assert "built" in said
    serve_only = only_nvidia_smi(tmp_path / "node-bin")  # a node with trtllm-serve alone
    (serve_only / "trtllm-serve").symlink_to(FAKES / "bin" / "trtllm-serve")
    node = {**env, "PATH": f"{serve_only}{os.pathsep}{os.environ['PATH']}"}
    said = cli(node, "pull", engine.digest, "-o", tmp_path / "dir", "--allow-unready",
               code=2).stderr
    assert "trtllm-refit is not on PATH" in said
    assert not (tmp_path / "dir").exists()  # checked before any byte moved


@SQLITE
def test_a_refit_that_fails_quarantines_the_engine(
        tmp_path: Path, env: dict[str, str], registry_url: str) -> None:
    recipe = stripped_recipe(tmp_path / "r", SHAPES[:1])
    done = cli({**env, "FAKE_TRTLLM_REFIT_FAIL": "RuntimeError: Failed to refit engine."},
               "build", recipe, code=5)
    assert "Failed to refit engine" in done.stderr
    (engine,) = artifacts(registry_url, "trtllm-engine")
    assert engine.status == "quarantined"
    assert "trtllm-refit exited 1" in (engine.status_reason or "")
    assert not artifacts(registry_url, "refit-equivalence")


def gc_and_fsck_keep_the_refit_source(tmp_path: Path, env: dict[str, str], url: str,
                                      engine: ArtifactRecord,
                                      checkpoint: ArtifactRecord) -> None:
    """The checkpoint deleted (as by hand), gc still keeps it for the stripped engines, a
    fresh node still refits from it, and fsck checks it."""
    with open_registry(url) as registry, registry.session() as session:
        mark_deleted(session, checkpoint.digest, "deleted by hand")
    cli(env, "gc", "--grace", "0s")
    fresh = {**env, "ENGINECTL_CACHE_DIR": str(tmp_path / "fresh-cache")}
    assert pulled(fresh, engine.digest, tmp_path / "c")["refit"]["seconds"] is not None
    cli(env, "fsck")
    weights = next(f for f in checkpoint.files if f.path == "rank0.safetensors")
    hexed = str(weights.xxh3).partition(":")[2]
    blob = tmp_path / "home" / "store" / "blobs" / "xxh3-128" / hexed[:2] / hexed[2:]
    blob.chmod(0o644)
    blob.unlink()
    said = cli(env, "fsck", code=4).stdout
    assert f"{checkpoint.digest}: rank0.safetensors: blob {weights.xxh3} is missing" in said
