"""`enginectl info` as a user runs it, on the file store and S3, with SQLite and PostgreSQL:
where each location came from, whether the store and registry answer, the schema, the
runtimes found — and nothing created or migrated by asking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.sql.schema import HEAD
from registry.store.base import Store
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import fake_gpu
from tests.integration.s3server import S3Server

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def env(store: Store, registry_url: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> dict[str, str]:
    values = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
              "ENGINECTL_STORE_URL": store.url, "ENGINECTL_REGISTRY_URL": registry_url,
              "ENGINECTL_VLLM_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1",
              "PATH": os.pathsep.join([str(FAKES / "bin"), os.environ["PATH"]]),
              **fake_gpu(tmp_path / "gpu")}
    for name in ("ENGINECTL_CACHE_DIR", "ENGINECTL_WORK_DIR"):
        values.pop(name, None)
    if store.url.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        values["ENGINECTL_S3_ENDPOINT_URL"] = server.endpoint_url
    return values


def info(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, "info", *args], env=env, timeout=120)
    assert done.returncode == code, (done.stdout, done.stderr)
    return done


def test_info_says_where_everything_is_and_what_answers(env: dict[str, str],
                                                        tmp_path: Path) -> None:
    found = json.loads(info(env, "--json").stdout)
    locations = found["locations"]
    assert locations["home"] == {"value": str(tmp_path / "home"), "source": "ENGINECTL_HOME"}
    assert locations["store"] == {"value": env["ENGINECTL_STORE_URL"],
                                  "source": "ENGINECTL_STORE_URL"}
    assert locations["registry"]["source"] == "ENGINECTL_REGISTRY_URL"
    assert locations["cache"]["source"] == "default"
    assert locations["work"] == {"value": str(tmp_path / "home" / "work"),
                                 "source": "default: <home>/work"}
    assert found["store"]["ok"] is True
    assert found["registry"] == {"ok": True, "detail": "reachable; no registry yet: `enginectl "
                                 "db upgrade` creates it, and so does the first command that "
                                 "writes to it (import, build)"}
    assert found["schema"] == {"revision": None, "head": HEAD, "state": "empty"}
    assert not (tmp_path / "home" / "registry.db").exists()  # asking created nothing
    runtimes = found["runtimes"]
    assert runtimes["vllm"]["path"] == sys.executable
    assert "has no vllm package" in runtimes["vllm"]["detail"]
    assert runtimes["trtllm-serve"]["path"] == str(FAKES / "bin" / "trtllm-serve")
    assert runtimes["nvidia-smi"]["version"] == "570.124.06"  # the stand-in's driver
    assert runtimes["nvidia-smi"]["detail"] == "1 x H100-SXM5-80GB"

    subprocess.run([ENGINECTL, "db", "upgrade"], env=env, check=True, capture_output=True)
    text = info(env).stdout
    assert f"schema        {HEAD} (this enginectl: {HEAD})" in text
    assert f"registry?     ok: reachable; schema {HEAD} (current)" in text
    assert "store?        ok: reachable" in text


def test_a_registry_that_does_not_answer_is_exit_4(env: dict[str, str]) -> None:
    env = {**env, "ENGINECTL_REGISTRY_URL": "postgresql+psycopg://nobody:secret@127.0.0.1:9/x",
           "ENGINECTL_REGISTRY_RETRY_S": "0"}  # refused is a blip, retried (and said) so long
    done = info(env, code=4)
    assert "registry?     FAIL: " in done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("enginectl: error: the registry does not answer: ")
    assert line.endswith("; check ENGINECTL_REGISTRY_URL")
    assert "secret" not in done.stdout + done.stderr
