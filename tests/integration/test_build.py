"""`enginectl build` as a user runs it: real processes, real registry and store.

TensorRT-LLM's programs are the stand-ins in tests/fakes (they accept exactly the real flags
and write the files the real tools write); everything else is the product.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from registry.sql.db import open_registry
from registry.sql.leases import get_stage_run
from registry.sql.records import list_artifacts
from tests.helpers import enginectl, fake_gpu, only_nvidia_smi, wait_gone
from tests.integration.builds import (
    ENGINECTL,
    SMALL_ENGINE,
    build,
    counts,
    cpu_recipe,
    make_model,
    smoke,
    start,
    wait_for_pidfile,
    waiting_for_the_engine,
    write_recipe,
)
from tests.integration.s3server import S3Server

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"


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
    shown = enginectl(env, "show", engine, "--json")
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
    note, *line = done.stderr.strip().splitlines()
    assert note.startswith("enginectl: note: using store ")
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


LEASE_TTL_S = 3.0


def test_a_killed_builders_lease_expires_and_is_taken_over(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """A builder killed with `kill -9` while a second one waits for its lease: its
    trtllm-build dies with it (no orphan building beside the next one), the lease expires
    and the waiting builder takes it over and builds the engine once."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": str(LEASE_TTL_S)}
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    first = start(hanging, recipe, "--only", SMALL_ENGINE)
    tool = wait_for_pidfile(first, pidfile)
    second = start(env, recipe, "--only", SMALL_ENGINE)
    waiting_for_the_engine(second)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    try:
        assert wait_gone(tool), "the killed builder's trtllm-build is still running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(tool, signal.SIGKILL)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert counts(out)["built"] == 1  # the engine; snapshot and convert were published before
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert len(list_artifacts(session, kind="trtllm-engine")) == 1


def test_a_lease_held_past_its_ttl_is_renewed_and_the_key_built_once(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """The engine's stage outlives the lease TTL several times while a second builder waits:
    the holder's renewals keep the lease, so the waiting builder never takes it over; it
    reuses the engine once the holder publishes it."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": str(LEASE_TTL_S)}
    fifo = tmp_path / "release-the-build"
    os.mkfifo(fifo)
    pidfile = tmp_path / "trtllm-build.pid"
    holding = {**env, "FAKE_TRTLLM_WAIT_FIFO": str(fifo), "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    first = start(holding, recipe, "--only", SMALL_ENGINE)
    wait_for_pidfile(first, pidfile)
    second = start(env, recipe, "--only", SMALL_ENGINE)
    waiting_for_the_engine(second)
    plan = json.loads(build(env, recipe, "--dry-run", "--json", "--only", SMALL_ENGINE).stdout)
    engine = next(s["key"] for s in plan["stages"] if s["kind"] == "trtllm-engine")
    deadline = time.monotonic() + 300
    with open_registry(registry_url) as registry:
        while True:  # until the lease has been renewed to more than 3 TTLs past its start
            with registry.session(readonly=True) as session:
                lease = get_stage_run(session, engine)
            assert lease is not None
            assert lease.status == "running"
            assert lease.lease_expires_at is not None
            held = (lease.lease_expires_at - lease.started_at).total_seconds()
            if held > 3 * LEASE_TTL_S:
                break
            assert first.poll() is None
            assert second.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.2)
    with fifo.open("wb") as release:
        release.write(b"go")
    out_first, err_first = first.communicate(timeout=600)
    out_second, err_second = second.communicate(timeout=600)
    assert (first.returncode, second.returncode) == (0, 0), (err_first, err_second)
    assert counts(out_first)["built"] == 3  # snapshot, convert and the engine
    assert counts(out_second) == {"built": 0, "reused": 3, "failed": 0, "skipped": 0}
    assert any(line.startswith("reused  build") for line in out_second.splitlines())
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert len(list_artifacts(session, kind="trtllm-engine")) == 1


def test_ctrl_c_stops_the_tool_and_records_the_run_cancelled(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """Ctrl-C (SIGINT to the builder's process group, as a terminal sends it) during the
    engine build: the tool is stopped, the run is recorded `cancelled`, its partial engine is
    removed, one line says what was kept, exit 130; a re-run resumes from what was kept."""
    recipe = write_recipe(tmp_path)
    pidfile = tmp_path / "trtllm-build.pid"
    hanging = {**env, "FAKE_TRTLLM_HANG": "1", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    proc = start(hanging, recipe, "--only", SMALL_ENGINE)
    tool = wait_for_pidfile(proc, pidfile)
    plan = json.loads(build(env, recipe, "--dry-run", "--json", "--only",
                            SMALL_ENGINE).stdout)
    engine = next(s for s in plan["stages"] if s["kind"] == "trtllm-engine")
    partial = Path(engine["workdir"]) / "out"
    assert (partial / "rank0.engine").is_file()  # what the stand-in wrote before it hung
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("enginectl: note:")]
    assert lines == [(
        f"enginectl: error: interrupted: cancelled build {engine['key'][3:15]} "
        f"({engine['targets'][0]}) (partial output removed); kept 2 finished stages "
        f"(published); rerun `enginectl build {recipe}` to resume from them"
    )], stderr
    assert "stopped build" in stdout
    assert wait_gone(tool)
    assert not partial.exists()
    assert (Path(engine["workdir"]) / "build.log").is_file()  # the log stays
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        assert list_artifacts(session, kind="trtllm-engine") == []
        assert list_artifacts(session, kind="converted-checkpoint")  # upstream work was kept
        lease = get_stage_run(session, engine["key"])
    assert lease is not None
    assert lease.status == "cancelled"
    resumed = json.loads(build(env, recipe, "--json", "--only", SMALL_ENGINE).stdout)
    assert {s["stage"]: s["status"] for s in resumed["stages"]} == {
        "snapshot": "reused", "convert": "reused", "build": "built", "smoke": "pending-smoke"}


def status_of(registry_url: str, digest: str) -> str:
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        (artifact,) = [a for a in list_artifacts(session) if a.digest == digest]
    return artifact.status


def test_an_engine_is_smoke_served_with_trtllm_serve_and_becomes_ready(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """No H100 here, so build leaves the engine built; `enginectl smoke` refuses (exit 3,
    status untouched) until the machine has what the engine needs — trtllm-serve, an H100
    (the nvidia-smi stand-in) — then serves it with the argv its manifest records, through
    the trtllm-serve stand-in (which accepts exactly trtllm-serve's options and serves the
    OpenAI routes). A server that cannot generate quarantines it (exit 5); a passing
    re-smoke clears that quarantine."""
    recipe = write_recipe(tmp_path)
    summary = json.loads(build(env, recipe, "--json", "--only", "*/small/trtllm").stdout)
    (pending,) = [s for s in summary["stages"] if s["status"] == "pending-smoke"]
    assert "needs a H100-SXM5-80GB" in pending["error"]
    engine = pending["digest"]
    h100 = fake_gpu(tmp_path / "gpu")
    no_serve = {**env, **h100, "PATH": os.pathsep.join(
        [str(only_nvidia_smi(tmp_path / "smi")),
         *(p for p in env["PATH"].split(os.pathsep) if p != str(FAKES / "bin"))])}
    refused = smoke(no_serve, engine, code=3)
    assert f"cannot smoke {engine} here: 'trtllm-serve' is not on PATH" in refused.stderr
    assert "its status stays built" in refused.stderr
    refused = smoke(env, engine, code=3)  # trtllm-serve, but no GPU
    assert "the engine is built for a H100-SXM5-80GB and this machine has no GPU" in \
        refused.stderr
    l4 = {**env, **fake_gpu(tmp_path / "l4", "NVIDIA L4")}
    refused = smoke(l4, engine, code=3)
    assert "this machine has L4" in refused.stderr
    assert status_of(registry_url, engine) == "built"
    env = {**env, **h100}
    broken = smoke({**env, "FAKE_OPENAI_FAIL_GENERATION": "1"}, engine, code=5)
    assert f"smoke failed, {engine} is quarantined: ready: " in broken.stderr
    assert status_of(registry_url, engine) == "quarantined"
    done = smoke(env, engine, "--json")
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


def test_a_machine_without_vllm_never_quarantines_the_entry(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """vLLM's Python without vllm (what an unset ENGINECTL_VLLM_PYTHON found: python3), then
    a vllm that cannot start its server: both are this machine's fault, so the entry stays
    `built` with the reason, no smoke report is recorded, and build still exits 0."""
    recipe = cpu_recipe(tmp_path)
    no_vllm = {**env, "ENGINECTL_VLLM_PYTHON": sys.executable}  # the test venv has no vllm
    first = json.loads(build(no_vllm, recipe, "--json").stdout)
    (pending,) = [s for s in first["stages"] if s["stage"] == "smoke"]
    assert pending["status"] == "pending-smoke"
    assert f"vLLM's Python {sys.executable!r} has no vllm package" in pending["error"]
    entry = pending["digest"]
    assert status_of(registry_url, entry) == "built"
    half = tmp_path / "half-a-vllm"  # a vllm package without its server
    (half / "vllm").mkdir(parents=True)
    (half / "vllm" / "__init__.py").write_text("")
    broken = {**no_vllm, "PYTHONPATH": str(half)}
    second = json.loads(build(broken, recipe, "--json").stdout)  # snapshot and entry reused
    assert {s["stage"]: s["status"] for s in second["stages"]} == {
        "snapshot": "reused", "build": "reused", "smoke": "pending-smoke"}
    (pending,) = [s for s in second["stages"] if s["stage"] == "smoke"]
    assert "the server could not start here: No module named 'vllm.entrypoints'" in \
        pending["error"]
    assert status_of(registry_url, entry) == "built"
    refused = smoke(broken, entry, code=3)
    assert f"cannot smoke {entry} here: the server could not start here" in refused.stderr
    shown = json.loads(enginectl(env, "show", entry, "--json").stdout)
    assert shown["smoke_reports"] == []
    assert shown["artifact"]["status"] == "built"
    assert shown["artifact"]["status_reason"].startswith("awaits smoke: ")


def test_published_outputs_leave_the_work_directory(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Once published (and found in the store) and read by every later run of the build, a
    stage's output is removed; its log stays. A later build that needs a removed output
    fetches it from the store. --keep-work keeps everything."""
    recipe = write_recipe(tmp_path)
    done = build(env, recipe, "-v", "--only", "*/small/trtllm")
    assert done.stderr.startswith("enginectl: note: using store file://")
    scheme = env["ENGINECTL_REGISTRY_URL"].split(":")[0]
    assert f" and registry {scheme}:" in done.stderr.splitlines()[0]
    assert "log " in done.stderr  # -v: where each run's log is
    plan = json.loads(build(env, recipe, "--dry-run", "--json").stdout)
    runs = {s["key"]: s for s in plan["stages"]}
    made = [s for s in runs.values() if s["built"] and s["stage"] in ("convert", "build")]
    assert {s["kind"] for s in made} == {"converted-checkpoint", "trtllm-engine"}
    for run in made:
        assert not (Path(run["workdir"]) / "out").exists(), run["stage"]
        assert (Path(run["workdir"]) / f"{run['stage']}.log").is_file()
    assert (tmp_path / "model" / "config.json").is_file()  # a local source is never removed
    wide = json.loads(build(env, recipe, "--json", "--only", "*/wide/trtllm").stdout)
    assert [s["stage"] for s in wide["stages"] if s["status"] == "built"] == ["build"]
    quiet = build(env, recipe, "-q", "--force", "--keep-work", "--only", "*/small/trtllm")
    assert quiet.stderr == ""
    assert not any(line.startswith("built ") and "  " in line[:8]
                   for line in quiet.stdout.splitlines())  # no per-stage lines, the summary
    kept = [s for s in runs.values() if s["stage"] in ("convert", "build")
            and "H100-SXM5-80GB/tp1/pp1/bf16/kv-auto/small/trtllm" in s["targets"]]
    assert kept
    for run in kept:
        assert (Path(run["workdir"]) / "out" / "config.json").is_file(), run["stage"]
