"""`kill -9` of `enginectl serve` (an OOM kill, a node agent's SIGKILL) leaves no server: the
server runs under the process runner's guard, which ends its whole group when serve dies of a
signal it cannot pass on."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pipeline.serving.server import free_port
from registry.context import Context
from tests.deploy import artifacts
from tests.deploy.serve_cli import BIN, READY_TIMEOUT_S, start, wait_answering
from tests.processes import tagged_processes


@pytest.mark.parametrize("store", ["file"], indirect=True)
@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_serve_killed_with_sigkill_leaves_no_server(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    engine = artifacts.engine(ctx, tmp_path / "engine")
    env = {**deploy_env, "PATH": os.pathsep.join([*map(str, BIN), os.environ["PATH"]])}
    port = free_port()
    process, tag = start(env, engine, "--host", "127.0.0.1", "--port", str(port))
    try:
        wait_answering(process, port)
        assert len(tagged_processes(tag)) >= 2  # serve, and the server (with its guard)
        os.kill(process.pid, signal.SIGKILL)  # serve alone: it cannot pass this one on
        process.communicate(timeout=READY_TIMEOUT_S)
        deadline = time.monotonic() + READY_TIMEOUT_S  # a guard, not a timing assertion
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tagged_processes(tag) == [], "the server outlived serve"
    finally:  # what a failure leaves behind is ours to end
        for pid in tagged_processes(tag):
            os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.communicate()
