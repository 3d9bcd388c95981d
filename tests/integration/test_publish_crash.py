"""A publish killed at any moment leaves no visible half-artifact, and a retry works, on
every store × database.

Each trial SIGKILLs a real `enginectl import` at a random moment of its run; the kill point
is random on purpose (this is fault injection, not synchronisation). Every command after
the kill must succeed: a failing `ls` is a failure, never "nothing registered".
bench/kill_publish.py runs the same check for 50+ trials of import and of fetch.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from registry.store.base import Store
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import make_engine
from tests.integration.s3server import S3Server

TRIALS = 3


def _enginectl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


@pytest.fixture
def env(store: Store, registry_url: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> dict[str, str]:
    values = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
              "ENGINECTL_STORE_URL": store.url, "ENGINECTL_REGISTRY_URL": registry_url,
              "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    if store.url.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        values["ENGINECTL_S3_ENDPOINT_URL"] = server.endpoint_url
    return values


def test_killed_publishes_leave_a_clean_store(env: dict[str, str], tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "engine", tp=4)
    argv = [ENGINECTL, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
            "--gpu", "h100", "--tp", "4", "--ready", "--json"]
    rng = random.Random(1234)
    for trial in range(TRIALS):
        for rank in range(4):  # new bytes each trial, a few MiB, so the kill can land mid-blob
            (engine / f"rank{rank}.engine").write_bytes(rng.randbytes(2 << 20))
        started = time.monotonic()
        if trial == 0:  # the first one runs whole: how long an import takes here
            _enginectl(env, *argv[1:])
            duration = time.monotonic() - started
            continue
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0, duration))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _enginectl(env, "fsck")
        listed = json.loads(_enginectl(env, "ls", "--json").stdout)
        assert listed, "the first trial's artifact must be listed"
        for row in listed:
            out = tmp_path / f"out{trial}-{row['digest'][7:19]}"
            _enginectl(env, "fetch", row["digest"], "-o", str(out))
        retry = json.loads(_enginectl(env, *argv[1:]).stdout)
        assert retry["digest"] in {r["digest"] for r in json.loads(
            _enginectl(env, "ls", "--json").stdout)}
        _enginectl(env, "fsck")
