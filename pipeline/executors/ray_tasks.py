"""The Ray executor's tasks: what runs on the nodes (`pipeline.executors.ray` submits them).

    probe_node   the toolchain probe, on one node
    run_stage    one stage run: re-plans the recipe on the node (pure, so the run's work paths
                 are the node's own) and hands the run to `pipeline.executors.stage.StageWorker`,
                 the code every executor shares; a node that joined its pool after the probe
                 is checked first
    kill_worker  the last step of stopping a task that answers no cancel (a frozen worker)

Ray pickles these functions by reference, so every node needs the same enginectl.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from pipeline.executors.outcome import Outcome
from pipeline.executors.pools import CPU_POOL
from pipeline.plan import Plan, plan_recipe
from pipeline.recipe import LoadedRecipe
from pipeline.settings import Settings
from pipeline.toolchain import PoolToolchains, for_build
from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import UsageError


def _node() -> dict[str, str]:
    return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}


def probe_node() -> dict[str, Any]:
    """The toolchain probe on this node (what `enginectl toolchain --json` prints here)."""
    from pipeline.toolchain import probe

    found = probe(Settings.from_env().python, os.environ.get("ENGINECTL_IMAGE_DIGEST"))
    return {**_node(), "toolchain": found.toolchain.as_dict(), "gpu_name": found.gpu_name,
            "gpu_count": found.gpu_count, "note": found.note}


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs: plain, picklable values (the plan is made again there)."""

    loaded: LoadedRecipe
    toolchains: PoolToolchains
    key: str
    digests: dict[str, str]
    owner: str
    force: bool
    pool: str
    local_gpu: str | None  # the SKU of the node it runs on (the pool's), for smoke runs
    probed: frozenset[str] = frozenset()  # nodes of the pool whose probe keyed the plan


_plans: dict[tuple[str, ...], Plan] = {}
_contexts: dict[RegistryConfig, Context] = {}
_cache_lock = threading.Lock()


def _plan_for(spec: TaskSpec, settings: Settings) -> Plan:
    key = (spec.loaded.digest, str(spec.loaded.source_digest), str(spec.loaded.revision),
           json.dumps(spec.toolchains.as_dict(), sort_keys=True), str(settings))
    with _cache_lock:
        plan = _plans.get(key)
    if plan is None:
        plan = plan_recipe(spec.loaded, settings, spec.toolchains)
        with _cache_lock:
            if len(_plans) > 8:
                _plans.clear()
            _plans[key] = plan
    return plan


def _context() -> Context:
    config = RegistryConfig.from_env()
    with _cache_lock:  # one registry engine per worker process, reused by its tasks
        if config not in _contexts:
            _contexts[config] = Context(config)
        return _contexts[config]


def _late_node(spec: TaskSpec, plan: Plan, settings: Settings) -> str | None:
    """Why this node, which joined its pool after the probe, cannot run for this plan."""
    from pipeline.toolchain import probe

    found = probe(settings.python, os.environ.get("ENGINECTL_IMAGE_DIGEST")).toolchain
    if spec.pool not in (CPU_POOL, found.gpu):
        return f"this node's nvidia-smi reports {found.gpu or 'no GPU'}, not {spec.pool}"
    try:
        here = for_build(found, plan.loaded.recipe.toolchain).as_dict()
    except UsageError as exc:
        return str(exc)
    pool = spec.toolchains.for_gpu(spec.pool).as_dict()
    ignored = {"gpu", "sm"} | ({"driver", "cuda"} if spec.pool == CPU_POOL else set())
    differ = [f"{k} {here[k]} (pool {pool[k]})" for k in here
              if k not in ignored and here[k] != pool[k]]
    return f"this node has {', '.join(differ)}" if differ else None


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _stop_children() -> None:
    """Stop every process group this worker started (a cancel may land while the runner is
    between its own SIGTERM and SIGKILL, which would leave a tool running)."""
    from pipeline.executors.runner import stop_all
    from pipeline.smoke import stop_all as stop_servers

    stop_all()
    stop_servers()
    for child in _children_of(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)


def kill_worker(pid: int) -> None:
    """On a node: kill a worker that answers no cancel (frozen), and its tools' groups."""
    for child in _children_of(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def run_stage(spec: TaskSpec) -> Outcome:
    """One stage run on this node, through the StageWorker every executor uses."""
    from pipeline.executors.stage import StageWorker

    started = time.monotonic()
    node = _node()
    settings = Settings.from_env()
    plan = _plan_for(spec, settings)
    run = plan.stages.get(spec.key)
    if run is None:
        return Outcome("?", spec.key, "failed", [], node=node,
                       error=f"node {node['host']} plans no stage with key {spec.key}: its "
                             "enginectl differs from the driver's; install the same version")
    if spec.probed and node["node_id"] not in spec.probed:
        why = _late_node(spec, plan, settings)
        if why is not None:
            return Outcome(run.stage, run.key, "failed", run.targets, node=node,
                           error=f"node {node['host']} joined pool {spec.pool} after its probe "
                                 f"and differs: {why}; run the build again to re-probe")
    worker = StageWorker(plan, _context(), settings, owner=spec.owner, force=spec.force,
                         local_gpu=spec.local_gpu, node_id=node["node_id"])
    try:
        outcome = worker.run(run, spec.digests)
    except BaseException:
        _stop_children()
        raise
    finally:  # later runs fetch it through this node's cache: the work copy can go now
        worker.workdirs.close()
    outcome.node = node
    outcome.seconds = outcome.seconds or time.monotonic() - started
    return outcome
