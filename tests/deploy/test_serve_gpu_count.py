"""serve refuses an artifact that needs more GPUs (tp × pp) than this node's nvidia-smi (the
stand-in, told how many to list) shows: exit 3, one line with the digest, tp × pp and the
count, before anything is pulled or started. With enough GPUs the same engine serves. The
resolve that `pull`/`serve --model` run counts tp × pp against the node's GPUs too."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from pipeline.serving.server import free_port
from registry.context import Context
from registry.ops.publish import publish
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.deploy import artifacts
from tests.deploy.serve_cli import BIN, READY_TIMEOUT_S, start, wait_answering
from tests.helpers import fake_gpu
from tests.processes import tagged_processes


@pytest.mark.parametrize("store", ["file"], indirect=True)
@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_a_tp2_engine_on_a_one_gpu_node_is_refused_before_the_pull(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    engine = artifacts.engine(ctx, tmp_path / "engine", tp=2)
    env = {**deploy_env, "PATH": os.pathsep.join([*map(str, BIN), os.environ["PATH"]])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    refused, tag = start({**env, **fake_gpu(tmp_path / "one")}, engine, "--host", "127.0.0.1",
                         "--port", str(free_port()))
    try:
        _, stderr = refused.communicate(timeout=READY_TIMEOUT_S)
    finally:  # a server it should never have started is ours to end
        for pid in tagged_processes(tag):
            os.kill(pid, signal.SIGKILL)
    assert refused.returncode == 3, stderr
    assert stderr.splitlines() == [(
        f"enginectl: error: cannot serve {engine} here: needs 2 GPUs (tp 2 x pp 1), this node "
        "has 1 (nvidia-smi); run it on a node with 2 H100-SXM5-80GB")]
    assert not (ctx.config.home / "serving").exists()  # nothing pulled

    port = free_port()  # two GPUs: the same engine serves
    process, started = start({**env, **fake_gpu(tmp_path / "two", count=2)}, engine,
                             "--host", "127.0.0.1", "--port", str(port))
    try:
        wait_answering(process, port)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=READY_TIMEOUT_S)
        for pid in tagged_processes(started):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("store", ["file"], indirect=True)
@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_resolve_for_pull_and_serve_counts_tp_times_pp(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    """`--gpus` (or nvidia-smi's count under `--gpu auto`) rejects an engine whose tp × pp
    exceeds it, with the product; a pp 1 engine keeps the old words."""
    root = tmp_path / "pp2"
    root.mkdir()
    (root / "rank0.engine").write_bytes(os.urandom(1000))
    (root / "rank1.engine").write_bytes(os.urandom(1000))
    labels = {"model": "m", "runtime": "trtllm", "gpu": "H100-SXM5-80GB", "sm": 90,
              "quant": "bf16", "tp": 1, "pp": 2, "max_batch_size": 4, "max_input_len": 128,
              "max_seq_len": 256}
    engine = publish(ctx, root, kind="trtllm-engine", labels=labels, status="ready").digest
    artifacts.smoked(ctx, engine, "H100-SXM5-80GB", 100.0)  # resolve takes only the proven

    def resolve(gpus: str, code: int) -> dict[str, object]:
        done = run_cli([ENGINECTL, "resolve", "--model", "m", "--gpu", "h100",
                        "--gpus", gpus, "--explain", "--json"], env=deploy_env, timeout=120)
        assert done.returncode == code, (done.stdout, done.stderr)
        answer: dict[str, object] = json.loads(done.stdout)
        return answer

    rejected = resolve("1", code=6)["rejected"]
    assert rejected == [{**rejected[0], "digest": engine,  # type: ignore[index]
                         "reason": "needs tp 1 x pp 2 = 2 GPUs, node has 1 GPUs"}]
    chosen = resolve("2", code=0)["candidates"]
    assert [c["digest"] for c in chosen] == [engine]  # type: ignore[attr-defined,index]
