"""`enginectl build` as a user runs it: real processes, real registry and store.

TensorRT-LLM's programs are the stand-ins in tests/fakes (they accept exactly the real flags
and write the files the real tools write); everything else is the product.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from registry.db import open_registry
from registry.records import get_stage_run, list_artifacts
from tests.integration.s3server import S3Server

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
ENGINECTL = str(Path(sys.executable).parent / "enginectl")


def make_model(root: Path) -> Path:
    root.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
              "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 4096, "rope_theta": 10000.0}
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(os.urandom(4096))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "tokenizer_config.json").write_text("{}")
    return root


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


@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "ENGINECTL_HOME": str(tmp_path / "home"),
        "ENGINECTL_REGISTRY_URL": registry_url,
        "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
        "ENGINECTL_PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
    }


def build(env: dict[str, str], recipe: Path, *args: str,
          code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ENGINECTL, "build", str(recipe), *args], env=env, text=True,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == code, (done.stdout, done.stderr)
    return done


def test_build_publishes_every_stage_then_reuses_all(env: dict[str, str], tmp_path: Path,
                                                     registry_url: str) -> None:
    recipe = write_recipe(tmp_path)
    first = json.loads(build(env, recipe, "--json", "--jobs", "3").stdout)
    # 1 snapshot + 1 convert + 2 engines + 2 vLLM entries; 4 smoke runs await a runtime
    assert (first["built"], first["reused"], first["failed"]) == (6, 0, 0)
    assert first["pending_smoke"] == 4
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        engines = list_artifacts(session, kind="trtllm-engine")
        assert {e.max_batch_size for e in engines} == {4, 16}
        assert {e.gpu for e in engines} == {"H100-SXM5-80GB"}
        assert all(e.status == "built" for e in engines)
        files = {f.path for f in engines[0].files}
        assert {"config.json", "rank0.engine", "tokenizer.json"} <= files
        run = get_stage_run(session, engines[0].key or "")
        assert run is not None
        assert run.status == "succeeded"
        assert run.artifact_digest == engines[0].digest
    again = json.loads(build(env, recipe, "--json").stdout)
    assert (again["built"], again["reused"]) == (0, 6)
    assert again["saved_seconds"] > 0
    engine = engines[0].digest
    fetched = tmp_path / "served"
    subprocess.run([ENGINECTL, "fetch", engine, "-o", str(fetched)], env=env, check=True,
                   capture_output=True)
    config = json.loads((fetched / "config.json").read_text())
    assert config["build_config"]["max_seq_len"] == 512
    shown = subprocess.run([ENGINECTL, "show", engine, "--json"], env=env, check=True,
                           capture_output=True, text=True)
    info = json.loads(shown.stdout)
    assert info["manifest"]["serve"]["argv"][:2] == ["trtllm-serve", "{model_dir}"]
    chain = info["provenance"]
    assert chain[0]["kind"] == "converted-checkpoint"
    assert chain[0]["inputs"][0]["kind"] == "hf-checkpoint"


def test_a_failing_stage_exits_3_with_its_log_and_publishes_nothing(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    recipe = write_recipe(tmp_path)
    failing = {**env, "FAKE_TRTLLM_FAIL": "out of memory while building layer 7"}
    done = build(failing, recipe, code=3)
    line = done.stderr.strip().splitlines()
    assert len(line) == 1
    assert line[0].startswith("enginectl: error: build ")
    assert "out of memory while building layer 7" in line[0]
    kept = json.loads(build(failing, recipe, "--json", "--keep-going", code=3).stdout)
    assert kept["failed"] == 2  # both engines, while the vLLM entries still built
    assert kept["built"] + kept["reused"] == 4  # snapshot, convert and the two entries
    assert kept["skipped"] == 2  # the failed engines' smoke runs
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert list_artifacts(session, kind="trtllm-engine") == []
    resumed = json.loads(build(env, recipe, "--json").stdout)
    assert resumed["built"] == 2  # just the two engines; everything upstream is a hit
    assert {s["stage"] for s in resumed["stages"] if s["status"] == "built"} == {"build"}


def test_only_and_dry_run(env: dict[str, str], tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)
    only = json.loads(build(env, recipe, "--json", "--only", "*/small/vllm").stdout)
    assert only["built"] == 2  # snapshot + the one vLLM entry
    dry = json.loads(build(env, recipe, "--dry-run", "--json").stdout)
    built = {s["stage"] for s in dry["stages"] if s["built"]}
    assert built == {"snapshot", "build"}
    assert sum(s["built"] for s in dry["stages"]) == 2
    done = build(env, recipe, "--only", "nothing-matches", code=2)
    assert "matches no target" in done.stderr


def test_plan_keys_as_the_last_build_on_this_machine_did(env: dict[str, str],
                                                          tmp_path: Path) -> None:
    """`plan` uses the toolchain `build` probed and recorded here, not the builder image's:
    the image digest this machine reports changes the engine and smoke keys."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_IMAGE_DIGEST": "sha256:" + "ab" * 32}
    before = subprocess.run([ENGINECTL, "plan", str(recipe), "--json"], env=env, text=True,
                            capture_output=True, check=True)
    assert "no toolchain is recorded" in before.stderr
    built = json.loads(build(env, recipe, "--json").stdout)
    after = subprocess.run([ENGINECTL, "plan", str(recipe), "--json"], env=env, text=True,
                           capture_output=True, check=True)
    assert after.stderr == ""
    planned = {s["key"]: s for s in json.loads(after.stdout)["stages"]}
    assert set(planned) == {s["key"] for s in built["stages"]}
    for stage in built["stages"]:  # what the build did is what the plan says is done
        assert planned[stage["key"]]["built"] == (stage["status"] == "built"), stage
    engines = [s for s in planned.values() if s["kind"] == "trtllm-engine"]
    assert {s["toolchain"]["image"] for s in engines} == {"sha256:" + "ab" * 32}
    text = subprocess.run([ENGINECTL, "plan", str(recipe)], env=env, text=True,
                          capture_output=True, check=True).stdout
    assert "new" not in {line.split()[-1] for line in text.splitlines()
                         if line.startswith("  build")}


def test_two_builders_run_every_key_once(env: dict[str, str], tmp_path: Path,
                                         registry_url: str) -> None:
    recipe = write_recipe(tmp_path)
    procs = [subprocess.Popen([ENGINECTL, "build", str(recipe), "--json", "--jobs", "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    summaries = [json.loads(out) for out, _ in outputs]
    built = [{s["key"] for s in summary["stages"] if s["status"] == "built"}
             for summary in summaries]
    assert not built[0] & built[1], "a key was built twice"
    assert len(built[0] | built[1]) == 6
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert len(list_artifacts(session)) == 6


def test_a_killed_builders_lease_expires_and_is_taken_over(
    env: dict[str, str], tmp_path: Path
) -> None:
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": "3"}
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    first = subprocess.Popen([ENGINECTL, "build", str(recipe), "--only", "*/small/trtllm"],
                             env=hanging, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 300
    while not pidfile.exists():  # the builder holds the engine's lease once its tool runs
        assert first.poll() is None, "the first builder exited early"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    # The tool runs in its own process group, so it outlives the killed builder (as a real
    # trtllm-build would): stop it when the test is done, not to leak a process per run.
    orphan = int(pidfile.read_text())
    try:
        second = json.loads(build(env, recipe, "--json", "--only", "*/small/trtllm").stdout)
        assert second["built"] == 1  # the engine; snapshot and convert were published before
        assert second["failed"] == 0
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_ctrl_c_stops_the_tool_and_releases_the_lease(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    recipe = write_recipe(tmp_path)
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    proc = subprocess.Popen([ENGINECTL, "build", str(recipe), "--only", "*/small/trtllm"],
                            env=hanging, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not pidfile.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    tool = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(tool, 0)
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert list_artifacts(session, kind="trtllm-engine") == []
        engine_keys = [a for a in list_artifacts(session) if a.kind == "converted-checkpoint"]
        assert engine_keys  # upstream work was kept
    plan = json.loads(build(env, recipe, "--dry-run", "--json", "--only",
                            "*/small/trtllm").stdout)
    engine = next(s for s in plan["stages"] if s["kind"] == "trtllm-engine")
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        lease = get_stage_run(session, engine["key"])
    assert lease is not None
    assert lease.status == "failed"


def test_an_engine_is_smoke_served_with_trtllm_serve_and_becomes_ready(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """No H100 here, so build leaves the engine built; `enginectl smoke` then serves it with
    the argv its manifest records, through the trtllm-serve stand-in (which accepts exactly
    trtllm-serve's options and serves the OpenAI routes)."""
    recipe = write_recipe(tmp_path)
    summary = json.loads(build(env, recipe, "--json", "--only", "*/small/trtllm").stdout)
    (pending,) = [s for s in summary["stages"] if s["status"] == "pending-smoke"]
    assert "needs a H100-SXM5-80GB" in pending["error"]
    engine = pending["digest"]
    done = subprocess.run([ENGINECTL, "smoke", engine, "--json"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["argv"][0] == "trtllm-serve"
    assert "--backend" in report["argv"]
    assert {c["name"] for c in report["checks"]} >= {"ready", "models", "greedy", "chat",
                                                     "stream", "long_prompt"}
    assert [level["concurrency"] for level in report["load"]] == [1, 4, 16]
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        (artifact,) = list_artifacts(session, kind="trtllm-engine")
    assert artifact.status == "ready"


def test_an_s3_source_is_snapshotted_from_the_bucket(
    env: dict[str, str], tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    model = make_model(tmp_path / "model-files")
    client = s3_server.client
    for path in model.iterdir():
        client.upload_file(str(path), s3_bucket, f"models/toy/{path.name}")
    recipe = {
        "model": {"name": "toy", "source": f"s3://{s3_bucket}/models/toy", "revision": "v1",
                  "architecture": {"num_layers": 2, "hidden_size": 128,
                                   "intermediate_size": 256, "num_attention_heads": 2,
                                   "num_key_value_heads": 2, "vocab_size": 1000}},
        "matrix": {"gpu": ["cpu"], "shape": [
            {"name": "s", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128}]},
        "serve": {"vllm": {}},
    }
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(recipe))
    s3_env = {**env, "ENGINECTL_S3_ENDPOINT_URL": s3_server.endpoint_url,
              "ENGINECTL_VLLM_PYTHON": str(tmp_path / "no-vllm-here")}
    summary = json.loads(build(s3_env, path, "--json").stdout)
    assert summary["built"] == 2  # the snapshot and the vLLM entry; smoke awaits vLLM
    fetched = tmp_path / "snapshot"
    snapshot = next(s["digest"] for s in summary["stages"] if s["stage"] == "snapshot")
    subprocess.run([ENGINECTL, "fetch", snapshot, "-o", str(fetched)], env=s3_env, check=True,
                   capture_output=True)
    weights = (model / "model.safetensors").read_bytes()
    assert (fetched / "model.safetensors").read_bytes() == weights
