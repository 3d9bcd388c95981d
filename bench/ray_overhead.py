"""What the Ray executor costs beyond the local one, on a local Ray cluster.

Targets: scheduling overhead under 100 ms more per stage than the local executor (cluster
start excluded); a 200-target plan preflighted and its stage runs submitted in under 2 s.

1. Overhead per stage. A recipe of 30 no-build vLLM entries on the CPU (1 snapshot, 30
   entries, 30 smoke runs that find no vLLM and stay pending: real StageWorker runs with
   leases and publishes, no tool). The same plan is walked by the local executor (3 threads)
   and by RayBackend on a local cluster, both with at most 3 runs in flight (the head has 3
   CPUs, so nothing waits in Ray's queue). For each stage run:
   latency = from submit to its Outcome on the driver, minus the Outcome's own seconds (the
   StageWorker's time, the same code on both). What is left is scheduling: threads, or Ray's
   task submission, a worker, re-planning and opening the registry on the node, the result.
2. 200 targets. A recipe of 2 GPUs x 2 tp x 50 shapes (403 stage runs) against a cluster
   with an H100 and an L40S node: time to read the nodes and check every SKU (preflight), to
   probe both pools, and to submit all 200 engine builds (their inputs do not exist, so they
   fail on the nodes; only submission is timed), then cancel them.

Run: `.venv/bin/python bench/ray_overhead.py` from the repository root (about a minute;
`--quick`: a head and an H100 node, 4 entries and 4 engines, to check the script runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAKES = ROOT / "tests" / "fakes"
H100 = {"name": "NVIDIA H100 80GB HBM3", "count": 8, "driver": "570.124.06", "cuda": "12.8"}
L40S = {"name": "NVIDIA L40S", "count": 4, "driver": "570.124.06", "cuda": "12.8"}


def start_cluster(tmp: Path, gpu_nodes: dict[str, dict[str, Any]]) -> Any:
    os.environ |= {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    from ray._raylet import Config
    from ray.cluster_utils import Cluster

    Config.initialize("")
    cluster = Cluster()
    for name, gpu in {"head": None, **gpu_nodes}.items():
        directory = tmp / name
        directory.mkdir(parents=True)
        (directory / "smi.json").write_text(json.dumps(gpu or {"count": 0}))
        env = {"PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
               "FAKE_NVIDIA_SMI_CONFIG": str(directory / "smi.json"),
               "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
               "ENGINECTL_HOME": str(directory / "home"),
               "ENGINECTL_VLLM_PYTHON": str(directory / "no-vllm"), "HF_HUB_OFFLINE": "1"}
        args: dict[str, Any] = {"num_cpus": 3, "env_vars": env, "include_dashboard": False}
        if gpu:
            from registry.gpus import lookup_gpu

            sku = lookup_gpu(gpu["name"]).sku
            args |= {"num_gpus": gpu["count"], "resources": {f"gpu:{sku}": gpu["count"]}}
        cluster.add_node(**args)
    cluster.wait_for_nodes()
    return cluster


def recipe(tmp: Path, **matrix: Any) -> Path:
    from tests.integration.builds import make_model

    make_model(tmp / "model")
    serve = matrix.pop("serve", None) or {"trtllm": {}}
    body = {"model": {"name": "bench", "source": "./model"},
            "matrix": {"quant": ["bf16"], **matrix}, "serve": serve}
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def shapes(count: int) -> list[dict[str, Any]]:
    return [{"name": f"s{i}", "max_batch_size": 1 + i, "max_input_len": 64, "max_seq_len": 128}
            for i in range(count)]


class Timed:
    """Wraps a backend: when each run was submitted and when its Outcome arrived."""

    def __init__(self, backend: Any, capacity: int) -> None:
        self.backend, self.capacity = backend, capacity  # the same bound on both executors
        self.latency: list[float] = []
        self.lock = threading.Lock()

    def submit(self, run: Any, digests: Mapping[str, str]) -> Future[Any]:
        began = time.monotonic()
        future: Future[Any] = self.backend.submit(run, digests)

        def done(finished: Future[Any]) -> None:
            outcome = finished.result()
            with self.lock:
                self.latency.append(time.monotonic() - began - outcome.seconds)

        future.add_done_callback(done)
        return future

    def wind_down(self) -> None:
        self.backend.wind_down()

    def stop(self) -> None:
        self.backend.stop()


def overhead(tmp: Path, *, entries: int = 30) -> dict[str, float]:
    from pipeline.executors import ray as ray_executor
    from pipeline.executors import ray_cluster
    from pipeline.executors.dag import walk
    from pipeline.executors.local import LocalExecutor, owner_id
    from pipeline.planning.plan import plan_recipe, selected_keys
    from pipeline.recipe.reader import load_recipe
    from pipeline.settings import Settings
    from registry.config import RegistryConfig
    from registry.context import Context

    path = recipe(tmp, gpu=["cpu"], shape=shapes(entries), serve={"vllm": {}})
    loaded = load_recipe(path)
    results = {}
    for kind in ("local", "ray"):
        home = tmp / f"driver-{kind}"
        os.environ["ENGINECTL_HOME"] = str(home)
        os.environ["ENGINECTL_VLLM_PYTHON"] = str(tmp / "no-vllm")
        ctx = Context(RegistryConfig.from_env())
        plan = plan_recipe(loaded, Settings.from_env())
        keys = selected_keys(plan, None)
        if kind == "local":
            with LocalExecutor(plan, ctx, Settings.from_env(), jobs=3) as local:
                timed = Timed(local, 3)
                began = time.monotonic()
                walk(plan, ctx, keys, timed, hits={})
        else:
            ray_cluster.connect("auto", ctx.config)
            with ray_executor.backend(plan, ctx, owner=owner_id()) as remote:
                timed = Timed(remote, 3)
                began = time.monotonic()
                walk(plan, ctx, keys, timed, hits={})
            ray_cluster.disconnect()
        wall = time.monotonic() - began
        ctx.close()
        lat = timed.latency
        warm = sorted(lat[3:])  # the first 3: a cold worker process each, on Ray
        results[kind] = warm
        print(f"{kind:>5}: {len(lat)} stage runs in {wall:.2f} s; scheduling per run: first 3 "
              f"{', '.join(f'{x * 1000:.0f}' for x in lat[:3])} ms; the rest median "
              f"{statistics.median(warm) * 1000:.0f} ms, p90 "
              f"{warm[int(len(warm) * 0.9)] * 1000:.0f} ms, max {warm[-1] * 1000:.0f} ms")
    more = statistics.median(results["ray"]) - statistics.median(results["local"])
    print(f"Ray adds {more * 1000:.0f} ms per stage run (median; target < 100 ms)")
    return {"more_ms": more * 1000}


def submit_200(tmp: Path, *, gpus: tuple[str, ...] = ("h100", "l40s"),
               count: int = 50) -> None:
    from pipeline.executors import ray as ray_executor
    from pipeline.executors import ray_cluster
    from pipeline.executors.groups import plan_groups
    from pipeline.executors.local import owner_id
    from pipeline.executors.pools import fleet_of, missing, nodes_from_ray
    from pipeline.executors.ray_build import pool_toolchains
    from pipeline.planning.plan import plan_recipe
    from pipeline.recipe.reader import load_recipe
    from pipeline.settings import Settings
    from registry.config import RegistryConfig
    from registry.context import Context

    path = recipe(tmp, gpu=list(gpus), tp=[1, 2], shape=shapes(count))
    os.environ["ENGINECTL_HOME"] = str(tmp / "driver-200")
    ctx = Context(RegistryConfig.from_env())
    ray_cluster.connect("auto", ctx.config)
    began = time.monotonic()
    loaded = load_recipe(path)
    settings = Settings.from_env()
    fleet = fleet_of(nodes_from_ray(ray_cluster.live_nodes()))
    draft = plan_recipe(loaded, settings)
    assert not missing(draft, fleet)
    preflighted = time.monotonic()
    probes = ray_executor.probe_pools({sku: p.nodes for sku, p in fleet.pools.items()},
                                      timeout_s=120)
    default, keyed, _notes = pool_toolchains(loaded, probes)
    plan = plan_groups(loaded, settings, default, keyed).plan
    probed = time.monotonic()
    builds = [run for run in plan.stages.values() if run.kind == "trtllm-engine"]
    with ray_executor.backend(plan, ctx, owner=owner_id()) as remote:
        for run in builds:
            remote.submit(run, dict.fromkeys(run.inputs, "sha256:" + "0" * 64))
        submitted = time.monotonic()
        remote.stop()
    ray_cluster.disconnect()
    ctx.close()
    print(f"200 targets ({len(plan.stages)} stage runs): preflight "
          f"{preflighted - began:.2f} s, probe of {sum(len(p) for p in probes.values())} "
          f"nodes {probed - preflighted:.2f} s, {len(builds)} builds submitted in "
          f"{submitted - probed:.2f} s; total {submitted - began:.2f} s (target < 2 s)")


def main() -> None:
    from _support import add_quick, quick_mode

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    quick = quick_mode(parser.parse_args().quick)
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as name:
        tmp = Path(name)
        nodes = {"h100": H100} if quick else {"h100": H100, "l40s": L40S}
        cluster = start_cluster(tmp / "nodes", nodes)
        os.environ["RAY_ADDRESS"] = cluster.address
        try:
            overhead(tmp / "overhead", entries=4 if quick else 30)
            submit_200(tmp / "submit", gpus=tuple(nodes), count=2 if quick else 50)
        finally:
            cluster.shutdown()


if __name__ == "__main__":
    main()
