"""A publish killed at any moment leaves no visible half-artifact, and a retry works.

Each trial SIGKILLs a real `enginectl import` at a random moment of its run; the kill point
is random on purpose (this is fault injection, not synchronisation). bench/kill_publish.py
runs the same check for 50+ trials and on S3 + PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_registry_verbs import make_engine

ENGINECTL = str(Path(sys.executable).parent / "enginectl")
TRIALS = 5


def _enginectl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGINECTL, *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_killed_publishes_leave_a_clean_store(tmp_path: Path) -> None:
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    engine = make_engine(tmp_path / "engine", tp=4)
    for rank in range(4):  # a few MiB, so the kill can land while blobs are written
        (engine / f"rank{rank}.engine").write_bytes(os.urandom(4 << 20))
    argv = [ENGINECTL, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
            "--gpu", "h100", "--tp", "4", "--ready", "--json"]
    started = time.monotonic()
    assert _enginectl(env, *argv[1:]).returncode == 0
    duration = time.monotonic() - started
    rng = random.Random(1234)
    for trial in range(TRIALS):
        env["ENGINECTL_HOME"] = str(tmp_path / f"home{trial}")
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0, duration))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        fsck = _enginectl(env, "fsck")
        assert fsck.returncode == 0, (trial, fsck.stdout, fsck.stderr)
        listed = json.loads(_enginectl(env, "ls", "--json").stdout or "[]")
        for row in listed:
            out = tmp_path / f"out{trial}"
            assert _enginectl(env, "fetch", row["digest"], "-o", str(out)).returncode == 0
        retry = _enginectl(env, *argv[1:])
        assert retry.returncode == 0, (trial, retry.stderr)
        assert _enginectl(env, "fsck").returncode == 0
