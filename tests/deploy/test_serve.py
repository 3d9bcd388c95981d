"""serve: resolve for this node (`--gpu auto` through a stand-in nvidia-smi), pull into the
serving directory once, run the server in the foreground, pass SIGTERM on, exit with the
server's code, and leave nothing running. The server is TensorRT-LLM's `trtllm-serve`
stand-in (tests/fakes/bin) serving an engine; vLLM's real server is in test_vllm_cpu.py.
Every case on the file store and S3, each with SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from pipeline.serving.server import free_port
from registry.context import Context
from tests.cli_forkserver import run_cli
from tests.deploy import artifacts
from tests.deploy.serve_cli import BIN, ENGINECTL, READY_TIMEOUT_S, start, wait_answering
from tests.helpers import fake_gpu
from tests.processes import tagged_processes


def test_serve_resolves_pulls_once_runs_in_the_foreground_and_passes_sigterm_on(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    engine = artifacts.engine(ctx, tmp_path / "engine")
    artifacts.engine(ctx, tmp_path / "h200", gpu="H200-SXM-141GB", seed=3)  # not this node's
    artifacts.smoked(ctx, engine, "H100-SXM5-80GB", 1000.0)
    env = {**deploy_env, "PATH": os.pathsep.join([*map(str, BIN), os.environ["PATH"]]),
           **fake_gpu(tmp_path / "gpu")}
    port = free_port()

    process, tag = start(env, "--model", "m", "--gpu", "auto", "--host", "127.0.0.1",
                         "--port", str(port))
    try:
        models = wait_answering(process, port)
        directory = ctx.config.home / "serving" / engine.removeprefix("sha256:")[:16]
        assert [model["id"] for model in models["data"]] == [directory.name]
        serve_json = json.loads((directory / "serve.json").read_text())
        assert serve_json["digest"] == engine
        assert serve_json["argv"][serve_json["argv"].index("--port") + 1] == str(port)
        assert tagged_processes(tag)  # the server runs
        os.kill(process.pid, signal.SIGTERM)  # enginectl's pid only: it passes it on
        _, stderr = process.communicate(timeout=READY_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()  # its pipes closed too
    assert process.returncode == 128 + signal.SIGTERM, stderr  # the stand-in died of it
    assert f"enginectl: serving {engine} from {directory}" in stderr
    assert tagged_processes(tag) == []  # nothing outlives serve

    inode = (directory / "rank0.engine").stat().st_ino
    again, tag = start(env, engine, "--host", "127.0.0.1", "--port", str(port))
    try:
        wait_answering(again, port)
        assert (directory / "rank0.engine").stat().st_ino == inode  # reused, not pulled again
        again.send_signal(signal.SIGINT)  # Ctrl-C at a terminal
        again.communicate(timeout=READY_TIMEOUT_S)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.communicate()
    assert again.returncode == 128 + signal.SIGINT
    assert tagged_processes(tag) == []


def test_serve_exits_with_the_servers_own_code(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    """A server that cannot start (the stand-in refuses an engine whose config wants a rank
    it lacks, as trtllm-serve does) ends serve with its exit code and its own words."""
    engine = artifacts.engine(ctx, tmp_path / "engine", world=2)
    env = {**deploy_env, "PATH": os.pathsep.join([*map(str, BIN), os.environ["PATH"]])}
    done = run_cli([ENGINECTL, "serve", engine, "--port", str(free_port()),
                    "--host", "127.0.0.1"], env=env, timeout=READY_TIMEOUT_S)
    assert done.returncode == 1, done.stderr
    assert "[TRT-LLM] [E] FileNotFoundError" in done.stdout
    assert "rank1.engine" in done.stdout
    assert "enginectl: error" not in done.stderr
