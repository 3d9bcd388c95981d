"""The registry commands as a user runs them: real processes, exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from registry.store.base import Store
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import make_engine
from tests.integration.s3server import S3Server


@pytest.fixture
def env(store: Store, registry_url: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> dict[str, str]:
    values = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
              "ENGINECTL_STORE_URL": store.url, "ENGINECTL_REGISTRY_URL": registry_url,
              "HF_HUB_OFFLINE": "1"}
    if store.url.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        values["ENGINECTL_S3_ENDPOINT_URL"] = server.endpoint_url
    return values


def run(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    if code:
        lines = [line for line in done.stderr.strip().splitlines()
                 if not line.startswith("enginectl: note: using store ")]
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("enginectl: error: "), done.stderr
        assert "Traceback" not in done.stderr
    return done


def test_import_ls_show_tag_fetch_resolve_fsck(env: dict[str, str], tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "engine")
    out = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
              "--gpu", "NVIDIA H100 80GB HBM3", "--quant", "fp8", "--ready", "--json")
    digest = json.loads(out.stdout)["digest"]
    listed = json.loads(run(env, "ls", "--json", "--gpu", "h100").stdout)
    assert [row["digest"] for row in listed] == [digest]
    assert listed[0]["max_seq_len"] == 4096
    assert listed[0]["tp"] == 2
    assert "rank1.engine" in run(env, "show", digest[7:19]).stdout
    run(env, "tag", digest, "m/h100/prod")
    assert json.loads(run(env, "ls", "--alias", "m/h100/prod", "--json").stdout)[0][
        "aliases"] == ["m/h100/prod"]
    fetched = json.loads(run(env, "fetch", "m/h100/prod", "-o", str(tmp_path / "out"),
                             "--json").stdout)
    assert fetched["digest"] == digest
    rank0 = (engine / "rank0.engine").read_bytes()
    assert (tmp_path / "out" / "rank0.engine").read_bytes() == rank0
    refused = run(env, "fetch", digest, "-o", str(tmp_path / "out"), code=2)
    assert "not empty" in refused.stderr
    assert "--force" in refused.stderr
    unproven = run(env, "resolve", "--model", "m", "--gpu", "h100", code=6)  # never smoked
    assert f"{digest[:19]}… trtllm-engine (no smoke evidence there)" in unproven.stderr
    ranked = json.loads(run(env, "resolve", "--model", "m", "--gpu", "h100", "--json",
                            "--allow-unproven").stdout)
    assert ranked["candidates"][0]["digest"] == digest
    assert ranked["candidates"][0]["note"] == "unproven on H100-SXM5-80GB (no smoke evidence there)"
    missing = run(env, "resolve", "--model", "m", "--gpu", "l4", "--explain", code=6)
    assert "--explain" in missing.stderr
    run(env, "fsck")
    run(env, "gc", "--dry-run")


def test_resolve_explain_gives_the_reason_for_every_rejection(env: dict[str, str],
                                                              tmp_path: Path) -> None:
    def imported(name: str, *args: str, seq: int = 4096, seed: int = 0) -> str:
        engine = make_engine(tmp_path / name, seq=seq, seed=seed)
        out = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
                  "--json", *args)
        digest: str = json.loads(out.stdout)["digest"]
        return digest

    h100 = imported("h100", "--gpu", "h100", "--quant", "fp8", "--ready")
    unready = imported("unready", "--gpu", "h100", "--quant", "fp8", seed=1)
    a100 = imported("a100", "--gpu", "a100", "--quant", "bf16", "--ready", seq=8192, seed=2)

    def reasons(*args: str, code: int = 0) -> dict[str, str]:
        out = run(env, "resolve", "--model", "m", "--explain", "--json", *args, code=code)
        ranked = json.loads(out.stdout)
        return {r["digest"]: r["reason"] for r in ranked["rejected"]}

    assert reasons("--gpu", "l4", code=6) == {
        h100: "GPU mismatch: engine built for H100-SXM5-80GB, node has L4",
        unready: "not ready (status built)",
        a100: "GPU mismatch: engine built for A100-SXM4-80GB, node has L4",
    }
    assert reasons("--gpu", "h100", "--min-seq-len", "8192", code=6) == {
        h100: "shape too small: max_seq_len 4096 < 8192",
        unready: "not ready (status built)",
        a100: "GPU mismatch: engine built for A100-SXM4-80GB, node has H100-SXM5-80GB",
    }
    assert reasons("--gpu", "a100", "--gpus", "1", code=6) == {
        h100: "GPU mismatch: engine built for H100-SXM5-80GB, node has A100-SXM4-80GB",
        unready: "not ready (status built)",
        a100: "needs tp 2, node has 1 GPUs",
    }
    text = run(env, "resolve", "--model", "m", "--gpu", "a100", "--gpus", "1", "--explain",
               code=6).stdout.splitlines()
    assert f"rejected {a100[:19]}… trtllm-engine: needs tp 2, node has 1 GPUs" in text
    assert f"rejected {unready[:19]}… trtllm-engine: not ready (status built)" in text


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["fetch", "deadbeef", "-o", "x"], 2, "too short"),
        (["fetch", "nosuchalias", "-o", "x"], 4, "`enginectl db upgrade` creates it"),
        (["fetch", "sha256:" + "0" * 64, "-o", "x"], 4, "/store does not exist"),
        (["import", ".", "--kind", "engine", "--model", "m"], 2, "--kind 'engine'"),
        (["resolve", "--model", "m", "--gpu", "v100"], 2, "unknown GPU 'v100'"),
        (["gc", "--grace", "a week"], 2, "--grace 'a week'"),
        (["untag", "nope"], 6, "no alias 'nope'"),
    ],
)
def test_bad_input_is_one_line_with_the_right_exit_code(
    tmp_path: Path, args: list[str], code: int, fragment: str
) -> None:
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    done = run(env, *args, code=code)
    assert fragment in done.stderr


def test_two_processes_publishing_the_same_artifact_end_with_one(
    env: dict[str, str], tmp_path: Path
) -> None:
    engine = make_engine(tmp_path / "engine", tp=4)
    argv = [ENGINECTL, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
            "--gpu", "h100", "--tp", "4", "--json"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    outcomes = [json.loads(stdout) for stdout, _ in results]
    assert outcomes[0]["digest"] == outcomes[1]["digest"]
    assert sorted(o["registered"] for o in outcomes) == [False, True]
    assert len(json.loads(run(env, "ls", "--json").stdout)) == 1
    run(env, "fsck")


def test_db_commands_report_the_schema(env: dict[str, str]) -> None:
    upgraded = run(env, "db", "upgrade").stdout
    assert "revision" in upgraded
    current = run(env, "db", "current").stdout
    assert "this enginectl" in current
