"""Warm-start caches (issue 25): captured by a passing smoke, published as a `warm-cache`
artifact keyed by the artifact, the node's GPU and fingerprint and the serving arguments,
pulled only where that key matches exactly, and used by the runtime from serve.json.

Everything runs as a user runs it, on TensorRT-LLM's stand-ins with a stand-in H100: `build`
smokes a TRT-LLM PyTorch-backend entry, whose server (tests/fakes/bin/trtllm-serve) tunes
its "autotuner" at start, loading and saving TLLM_AUTOTUNER_CACHE_PATH as 1.2's does; then
`ls`, `show`, `pull`, `reindex` and `gc` from the CLI, and the server started from serve.json.
(vLLM's own compile cache is measured in bench/warm_start.py.)
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.serving.server import free_port
from registry.sql.db import open_registry
from registry.sql.records import get_artifact, list_artifacts
from tests.helpers import builder_env, fake_gpu
from tests.helpers import enginectl as cli

START_TIMEOUT_S = 120
H100 = "NVIDIA H100 80GB HBM3"




@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    return {**builder_env(tmp_path, registry_url), **fake_gpu(tmp_path / "gpu"),
            "ENGINECTL_CACHE_DIR": str(tmp_path / "fetch-cache")}  # nothing shared: a damage test


@pytest.fixture
def sqlite_env(tmp_path: Path) -> dict[str, str]:
    """`env` on SQLite alone: for what does not depend on the registry's database."""
    return {**builder_env(tmp_path, f"sqlite:///{tmp_path / 'home' / 'registry.db'}"),
            **fake_gpu(tmp_path / "gpu"), "ENGINECTL_CACHE_DIR": str(tmp_path / "fetch-cache")}


def built(tmp_path: Path, env: dict[str, str], model: Path) -> str:
    """Build a TRT-LLM PyTorch-backend entry of *model* for the H100 (smoked here); its
    digest."""
    shutil.copytree(model, tmp_path / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"],
                   "shape": [{"name": "small", "max_batch_size": 4, "max_input_len": 256,
                              "max_seq_len": 512}]},
        "serve": {"trtllm-pytorch": {}},
        "smoke": {"prompts": ["The capital of France is"], "max_tokens": 4,
                  "concurrency": [1], "requests": 2, "ready_timeout_s": START_TIMEOUT_S},
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cli(env, "build", path)
    entries = json.loads(cli(env, "ls", "--kind", "trtllm-checkpoint", "--json").stdout)
    (entry,) = [e for e in entries if e["status"] == "ready"]
    return str(entry["digest"])


def warm_caches(env: dict[str, str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(cli(env, "ls", "--kind", "warm-cache",
                                                 "--json").stdout)
    return found


def started(serve_json: Path, cwd: Path) -> str:
    """Run serve.json as a deploy tool does (argv from `cwd` with `env`); its log once it
    answers, then stop it."""
    data = json.loads(serve_json.read_text())
    log_path = cwd / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(data["argv"], cwd=data["cwd"],
                                   env={**os.environ, **data["env"]}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            connection = http.client.HTTPConnection("127.0.0.1", data["port"], timeout=5)
            try:
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return log_path.read_text()
            except OSError:
                pass
            finally:
                connection.close()
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer: {log_path.read_text()}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_smoke_captures_it_and_a_pull_places_the_exact_match(
        tmp_path: Path, env: dict[str, str], tiny_model: Path) -> None:
    entry = built(tmp_path, env, tiny_model)
    (warm,) = warm_caches(env)
    assert warm["status"] == "ready"
    assert warm["gpu"] == "H100-SXM5-80GB"
    shown = json.loads(cli(env, "show", entry, "--json").stdout)
    assert [w["digest"] for w in shown["warm_caches"]] == [warm["digest"]]
    assert "warm      " + warm["digest"] in cli(env, "show", entry).stdout
    manifest = json.loads(cli(env, "show", warm["digest"], "--json").stdout)["manifest"]
    assert manifest["kind"] == "warm-cache"
    assert manifest["inputs"] == [entry]
    assert manifest["labels"]["artifact"] == entry
    assert [f["path"] for f in manifest["files"]] == ["trtllm/autotuner.json"]

    out = tmp_path / "served"
    pulled = json.loads(cli(env, "pull", entry, "-o", out, "--host", "127.0.0.1", "--port",
                            str(free_port()), "--json", cwd=tmp_path).stdout)
    assert pulled["warm_cache"] == warm["digest"]
    assert pulled["env"]["TLLM_AUTOTUNER_CACHE_PATH"] == ".warm/trtllm/autotuner.json"
    cache = out / ".warm" / "trtllm" / "autotuner.json"
    assert os.access(cache, os.W_OK)
    assert cache.stat().st_nlink == 1
    assert str(tmp_path) not in cache.read_text()  # nothing host-specific
    third = tmp_path / "elsewhere"
    third.mkdir()
    log = started(out / "serve.json", third)
    assert "[Autotuner] Loading cache from .warm/trtllm/autotuner.json" in log
    assert "profiled 0 shapes" in log

    cli(env, "smoke", entry)  # this node has its warm cache now: the smoke starts from it
    reports = json.loads(cli(env, "show", entry, "--json").stdout)["smoke_reports"]
    assert reports[0]["report"]["warm_cache"] is None
    assert reports[-1]["report"]["warm_cache"] == warm["digest"]
    assert reports[-1]["report"]["warm_use"] == "used"  # the autotuner said it loaded it
    assert warm_caches(env) == [warm]  # it started warm and changed nothing: no second one
    compared = json.loads(cli(env, "compare", "--model", "toy", "--json").stdout)
    (row,) = compared["rows"]
    assert row["warm_ready_s"] == reports[-1]["report"]["ready_s"]
    assert row["warm_use"] == "used"
    assert row["ready_s"] == reports[0]["report"]["ready_s"]
    again = cli(env, "pull", entry, "-o", tmp_path / "again", "--json")
    assert "at its last smoke start the runtime used" in again.stderr
    assert json.loads(again.stdout)["warm_use"] == "used"

    cold = tmp_path / "cold"
    pulled = json.loads(cli(env, "pull", entry, "-o", cold, "--no-warm", "--json").stdout)
    assert pulled["warm_cache"] is None
    assert pulled["env"] == {}
    assert not (cold / ".warm").exists()


def forged(tmp_path: Path, env: dict[str, str], warm: dict[str, Any], *,
           toolchain: dict[str, Any] | None = None, content: bytes | None = None) -> str:
    """A warm cache written beside *warm* with the API anyone with the bucket and the
    registry has: its key column this node's, its manifest's *toolchain* or its autotuner
    file's *content* not *warm*'s. Its digest."""
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.ops.publish import publish

    manifest = json.loads(cli(env, "show", warm["digest"], "--json").stdout)["manifest"]
    files = tmp_path / "forged"
    (files / "trtllm").mkdir(parents=True)
    (files / "trtllm" / "autotuner.json").write_bytes(content or b'{"gemm:m=1": {}}')
    ctx = Context(RegistryConfig.from_env(env))
    try:
        return publish(ctx, files, kind="warm-cache", status="ready", key=manifest["key"],
                       labels=manifest["labels"], inputs=tuple(manifest["inputs"]),
                       serve=manifest["serve"],
                       toolchain=toolchain or manifest["toolchain"]).digest
    finally:
        ctx.close()


def test_a_cache_whose_manifest_records_another_node_is_never_placed(
        tmp_path: Path, sqlite_env: dict[str, str], tiny_model: Path) -> None:
    env = sqlite_env
    entry = built(tmp_path, env, tiny_model)
    (warm,) = warm_caches(env)
    manifest = json.loads(cli(env, "show", warm["digest"], "--json").stdout)["manifest"]
    a100 = {**manifest["toolchain"], "gpu": "A100-SXM4-80GB", "sm": 80, "driver": "999.99.99"}
    bad = forged(tmp_path, env, warm, toolchain=a100)
    assert {w["key"] for w in warm_caches(env)} == {warm["key"]}  # the same key column
    done = cli(env, "pull", entry, "-o", tmp_path / "served", "--json")
    assert json.loads(done.stdout)["warm_cache"] == warm["digest"]  # the honest one
    assert f"warm cache {bad[:19]} records another node" in done.stderr
    assert "driver 999.99.99 → 570.124.06" in done.stderr


def test_a_cache_the_server_fails_with_is_refused_and_the_verdict_is_the_cold_start(
        tmp_path: Path, sqlite_env: dict[str, str], tiny_model: Path) -> None:
    env = sqlite_env
    entry = built(tmp_path, env, tiny_model)
    (warm,) = warm_caches(env)
    bad = forged(tmp_path, env, warm, content=b"{not json")
    done = cli(env, "smoke", entry)  # starts from the newest: the broken one
    assert done.returncode == 0
    report = json.loads(cli(env, "show", entry, "--json").stdout)["smoke_reports"][-1]
    assert report["passed"]
    assert report["report"]["warm_cache"] is None  # the cold start is the verdict
    assert f"failed with warm cache {bad}" in report["report"]["warm_refused"]
    shown = json.loads(cli(env, "show", entry, "--json").stdout)
    assert shown["artifact"]["status"] == "ready"
    refused = json.loads(cli(env, "show", bad, "--json").stdout)["artifact"]
    assert refused["status"] == "quarantined"
    assert refused["status_reason"].startswith("refused: ")
    assert bad not in {w["digest"] for w in warm_caches(env) if w["status"] == "ready"}
    pulled = json.loads(cli(env, "pull", entry, "-o", tmp_path / "served", "--json").stdout)
    assert pulled["warm_cache"] not in (None, bad)
    fresh = {**env, "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    cli(fresh, "reindex")  # the refusal is a record in the bucket: it comes back with it
    pulled = json.loads(cli(fresh, "pull", entry, "-o", tmp_path / "again", "--json").stdout)
    assert pulled["warm_cache"] not in (None, bad)


def test_what_passes_the_capture_cap_is_left_out_and_never_fails_the_smoke(
        tmp_path: Path, sqlite_env: dict[str, str], tiny_model: Path) -> None:
    env = sqlite_env
    capped = {**env, "ENGINECTL_WARM_CAPTURE_MAX_BYTES": "10"}  # less than the autotuner's file
    entry = built(tmp_path, capped, tiny_model)  # exit 0, the entry ready
    assert warm_caches(capped) == []
    (report,) = json.loads(cli(capped, "show", entry, "--json").stdout)["smoke_reports"]
    log = Path(report["report"]["log_path"]).read_text()
    assert ("warm cache capture skipped 1 file(s) over the cap of 10 bytes "
            "(ENGINECTL_WARM_CAPTURE_MAX_BYTES): trtllm/autotuner.json (") in log


def test_a_driver_bump_or_another_gpu_is_a_miss_said_in_one_line(
        tmp_path: Path, env: dict[str, str], tiny_model: Path) -> None:
    entry = built(tmp_path, env, tiny_model)
    bumped = {**env, **fake_gpu(tmp_path / "bumped", driver="575.57.08")}
    done = cli(bumped, "pull", entry, "-o", tmp_path / "a", "--json")
    assert json.loads(done.stdout)["warm_cache"] is None
    (line,) = [x for x in done.stderr.splitlines() if "warm cache" in x]
    assert "driver 570.124.06 → 575.57.08" in line
    assert "starts cold" in line
    assert not (tmp_path / "a" / ".warm").exists()

    other = {**env, **fake_gpu(tmp_path / "a100", name="NVIDIA A100-SXM4-80GB")}
    done = cli(other, "pull", entry, "-o", tmp_path / "b", "--json")
    assert json.loads(done.stdout)["warm_cache"] is None
    assert "gpu H100-SXM5-80GB → A100" in done.stderr


def test_a_damaged_cache_starts_cold_and_gc_removes_it_with_its_artifact(
        tmp_path: Path, env: dict[str, str], tiny_model: Path, registry_url: str) -> None:
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.ops import history

    entry = built(tmp_path, env, tiny_model)
    (warm,) = warm_caches(env)
    manifest = json.loads(cli(env, "show", warm["digest"], "--json").stdout)["manifest"]
    (blob,) = [f["xxh3"] for f in manifest["files"]]
    hexdigest = blob.split(":", 1)[1]
    (stored,) = (tmp_path / "home").rglob(f"{hexdigest[2:]}*")
    stored.chmod(0o644)
    stored.write_bytes(b'{"damaged": tru')
    done = cli(env, "pull", entry, "-o", tmp_path / "served", "--json")
    assert json.loads(done.stdout)["warm_cache"] is None
    assert "cannot be used" in done.stderr
    assert "starting cold" in done.stderr
    assert not (tmp_path / "served" / ".warm").exists()

    ctx = Context(RegistryConfig.from_env(env))
    try:
        with ctx.registry.session() as session:
            history.set_status_and_record(ctx.store, session, entry, "deleted",
                                          "test: retired by hand")
    finally:
        ctx.close()
    cli(env, "gc", "--grace", "0s")
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        record = get_artifact(session, warm["digest"])
        assert record is not None
        assert record.status == "deleted"
        assert all(a.status == "deleted" for a in list_artifacts(session, kind="warm-cache"))


def test_reindex_brings_warm_caches_back(tmp_path: Path, env: dict[str, str],
                                         tiny_model: Path) -> None:
    entry = built(tmp_path, env, tiny_model)
    (warm,) = warm_caches(env)
    fresh = {**env, "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    cli(fresh, "reindex")
    assert [w["digest"] for w in warm_caches(fresh)] == [warm["digest"]]
    pulled = json.loads(cli(fresh, "pull", entry, "-o", tmp_path / "served", "--json").stdout)
    assert pulled["warm_cache"] == warm["digest"]
