"""The local Ray cluster's parts and the CLI helpers of the fleet tests (tests/ray/conftest.py
starts the cluster): its nodes and their stand-ins, the fleet recipe, enginectl on the driver."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from registry.sql.db import open_registry
from registry.sql.leases import get_stage_run
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import children_get_default_signals, expect_exit, with_default_signals
from tests.integration.builds import make_model

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
NODEBIN = Path(__file__).resolve().parent / "nodebin"
H100 = "H100-SXM5-80GB"
DRIVER = "570.124.06"
GPUS = {  # what each node's nvidia-smi reports
    "h100-a": {"name": "NVIDIA H100 80GB HBM3", "count": 2, "memory_mib": 81559,
               "compute_cap": "9.0"},
    "h100-b": {"name": "NVIDIA H100 80GB HBM3", "count": 2, "memory_mib": 81559,
               "compute_cap": "9.0"},
    "l40s": {"name": "NVIDIA L40S", "count": 1, "memory_mib": 46068, "compute_cap": "8.9"},
}
RESOURCES = {"h100-a": {f"gpu:{H100}": 2}, "h100-b": {f"gpu:{H100}": 2}, "l40s": {"gpu:L40S": 1}}
IMAGES = {  # the builder image each node runs (its own ENGINECTL_IMAGE_DIGEST), one per pool
    "head": "sha256:" + "c0" * 32, "h100-a": "sha256:" + "a1" * 32,
    "h100-b": "sha256:" + "a1" * 32, "l40s": "sha256:" + "1a" * 32,
}
SECRET = "never-print-this-7f3a"  # noqa: S105 - the registry password and S3 secret key the tests use
ONE_H100: dict[str, Any] = {"gpu": ["h100"], "tp": [1], "include": [],
                            "exclude": [{"runtime": "vllm"}]}
"""fleet_recipe changes: one H100 engine at tp 1, no vLLM entry."""
PG = pytest.mark.parametrize("fleet_env", [("file", "postgresql")], indirect=True,
                             ids=["file-postgresql"])
"""Run a test on a file store and PostgreSQL only."""
RAY_TIMEOUT_S = 300  # a guard against a hung CLI, not a timing assertion


@dataclass
class FakeNode:
    name: str
    directory: Path
    node: Any  # ray._private.node.Node

    @property
    def node_id(self) -> str:
        return str(self.node.node_id)

    def set_driver(self, driver: str) -> None:
        """What this node's nvidia-smi reports as its driver from now on."""
        path = self.directory / "nvidia-smi.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "driver": driver}))

    def hang_builds(self, on: bool) -> None:
        """Make this node's trtllm-build hang (and record its pid) until switched off."""
        flag = self.directory / "hang-trtllm-build"
        self.tool_pidfile.unlink(missing_ok=True)  # a pid from an earlier build misleads
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    @property
    def tool_pidfile(self) -> Path:
        return self.directory / "trtllm-build.pid"


@dataclass
class FakeCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    root: Path
    nodes: dict[str, FakeNode]
    ray_env: dict[str, str]  # what the driver needs: address, auth, no usage stats

    def add(self, name: str) -> FakeNode:
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "home").mkdir(exist_ok=True)
        gpu = GPUS.get(name)
        config = {**gpu, "driver": DRIVER, "node": name} if gpu else {"count": 0}
        (directory / "nvidia-smi.json").write_text(json.dumps(config))
        env = {
            "PATH": f"{NODEBIN}{os.pathsep}{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "FAKE_NVIDIA_SMI_CONFIG": str(directory / "nvidia-smi.json"),
            "ENGINECTL_TEST_NODE_DIR": str(directory),
            "ENGINECTL_HOME": str(directory / "home"),
            "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
            "ENGINECTL_PYTHON": sys.executable,
            "ENGINECTL_VLLM_PYTHON": str(directory / "no-vllm-on-this-node"),
            "ENGINECTL_IMAGE_DIGEST": IMAGES[name],
            "AWS_CONFIG_FILE": str(directory / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(directory / "no-aws-credentials"),
            "HF_HUB_OFFLINE": "1",
        }
        if "FAKE_TRTLLM_MEMO" in os.environ:  # tests/conftest.py: trtllm_serve_memo
            env["FAKE_TRTLLM_MEMO"] = os.environ["FAKE_TRTLLM_MEMO"]
        args: dict[str, Any] = {"num_cpus": 2, "env_vars": env, "include_dashboard": False}
        if gpu:
            args |= {"num_gpus": gpu["count"], "resources": RESOURCES[name]}
        if not self.nodes:
            args["_system_config"] = {"health_check_period_ms": 500,
                                      "health_check_failure_threshold": 3}
            # No log monitor (the head's; other nodes have none on one host): it tails every
            # worker's log for drivers that ask for them, and enginectl's driver does not
            # (log_to_driver=False): ~65 CPU-s a run, polling.
            args["include_log_monitor"] = False
        with children_get_default_signals():  # Ray's cancel interrupts with SIGINT
            node = self.cluster.add_node(**args)
        self.nodes[name] = FakeNode(name, directory, node)
        return self.nodes[name]

    def kill(self, name: str) -> None:
        """Kill a worker node's raylet and workers (no grace): a machine lost mid-stage."""
        self.cluster.remove_node(self.nodes.pop(name).node, allow_graceful=False)

    def node_named(self, node_id: str) -> str:
        return next(n.name for n in self.nodes.values() if n.node_id == node_id)


def fleet_recipe(directory: Path, name: str = "tiny-fleet", **changes: Any) -> Path:
    """A tiny-model twin of recipes/llama8b-fleet.yaml: engines on the L40S and H100 pools
    (tp 1, and tp 2 on H100), plus a vLLM entry on the CPU; *changes* replace top-level
    sections or matrix axes (`gpu=[...]`)."""
    make_model(directory / "model")
    recipe: dict[str, Any] = {
        "name": name,
        "model": {"name": name, "source": "./model"},
        "matrix": {
            "gpu": ["l40s", "h100"], "tp": [1, 2], "quant": ["bf16"],
            "shape": [{"name": "chat", "max_batch_size": 4, "max_input_len": 128,
                       "max_seq_len": 256}],
            "exclude": [{"gpu": "l40s", "tp": 2}, {"runtime": "vllm"}],
            "include": [{"gpu": "cpu", "tp": 1, "quant": "bf16", "runtime": "vllm"}],
        },
        "serve": {"trtllm": {}, "vllm": {"enforce_eager": True}},
        "smoke": {"max_tokens": 4, "concurrency": [1, 2], "requests": 4,
                  "gpu_price_per_hour": {"h100": 3.5, "l40s": 1.2}},
    }
    for key, value in changes.items():
        if key in recipe["matrix"]:
            recipe["matrix"][key] = value
        elif value is None:
            recipe.pop(key, None)
        else:
            recipe[key] = value
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def enginectl(env: dict[str, str], *args: str, code: int | None = 0,
              timeout: float = RAY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=timeout)
    expect_exit(done, code)
    return done


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """enginectl with *args*, its signals at their defaults (a test sends it Ctrl-C)."""
    return subprocess.Popen(with_default_signals([ENGINECTL, *args]), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = RAY_TIMEOUT_S) -> None:
    """Until *path* exists (a stand-in's pidfile), while *proc* runs."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the build exited {proc.returncode} early: {out[-2000:]} {err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def kill_tool(pidfile: Path) -> None:
    """Kill a hanging stand-in its worker left behind (a killed node's processes)."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def stage_rows(env: dict[str, str], keys: list[str]) -> dict[str, object]:
    """The registry's stage run for each of *keys* (None where there is none)."""
    with open_registry(env["ENGINECTL_REGISTRY_URL"]) as registry, \
            registry.session(readonly=True) as session:
        return {key: get_stage_run(session, key) for key in keys}
