"""The Ray executor's tasks: what runs on the nodes (`pipeline.executors.ray` submits them).

    probe_node   the toolchain probe, on one node
    run_stage    one stage run: re-plans the recipe on the node (pure, so the run's work paths
                 are the node's own) and hands the run to `pipeline.executors.stage.StageWorker`,
                 the code every executor shares; a node that joined its pool after the probe
                 is checked first
    kill_worker  the last step of stopping a task that answers no cancel (a frozen worker)

Ray pickles these functions by reference, so every node needs the same enginectl.

A run that asks Ray for no GPU sees none: Ray 2.60 sets CUDA_VISIBLE_DEVICES to a task's
assigned GPU ids only when it has some (ray/_private/utils.py `set_visible_accelerator_ids`
skips an empty list unless RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1, ray-project/ray#54868;
NvidiaGPUAcceleratorManager.set_current_process_visible_accelerator_ids in
ray/_private/accelerators/nvidia_gpu.py writes the ids, and writes nothing under
RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES). A zero-GPU task would otherwise inherit the
node's variable, every GPU, and its tools could take memory on GPUs a build or smoke holds.
So `run_stage` empties it for the run when Ray assigned no GPU (and the node did not opt out
with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), and puts the worker's value back after.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import ray

from pipeline.executors.groups import CPU_POOL_IGNORES
from pipeline.executors.pools import CPU_POOL
from pipeline.host.guard import signal_group
from pipeline.planning.outcome import Outcome
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.planning.source import ModelSource
from pipeline.planning.toolchain import PoolToolchains, for_build
from pipeline.recipe.reader import LoadedRecipe
from pipeline.settings import Settings
from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import UsageError

CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
NOSET: Final = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # Ray leaves the variable alone


def _node() -> dict[str, str]:
    return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}


def probe_node() -> dict[str, Any]:
    """The toolchain probe on this node (what `enginectl toolchain --json` prints here)."""
    from pipeline.planning.probe import probe

    # a Ray task is its node's top: this node's own Pythons, nvidia-smi and image digest
    found = probe(Settings.from_env())
    return {**_node(), "toolchain": found.toolchain.as_dict(), "gpu_name": found.gpu_name,
            "gpu_count": found.gpu_count, "note": found.note, "sources": dict(found.sources)}


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
    source: ModelSource = field(kw_only=True)  # the driver's: the same commit keys both


_plans: dict[tuple[str, ...], Plan] = {}
_contexts: dict[RegistryConfig, Context] = {}
_cache_lock = threading.Lock()


def _plan_for(spec: TaskSpec, settings: Settings) -> Plan:
    key = (spec.loaded.digest, repr(spec.source),
           json.dumps(spec.toolchains.as_dict(), sort_keys=True), str(settings))
    with _cache_lock:
        plan = _plans.get(key)
    if plan is None:
        plan = plan_recipe(spec.loaded, settings, spec.toolchains, source=spec.source)
        with _cache_lock:
            if len(_plans) > 8:
                _plans.clear()
            _plans[key] = plan
    return plan


def _context() -> Context:
    """This worker's Context. A Ray task's entry point is its node's top: the driver's
    Context and Settings do not travel, so the node makes its own from its environment."""
    config = RegistryConfig.from_env()
    with _cache_lock:  # one registry engine per worker process, reused by its tasks
        if config not in _contexts:
            _contexts[config] = Context(config)
        return _contexts[config]


def _late_node(spec: TaskSpec, plan: Plan, settings: Settings) -> str | None:
    """Why this node, which joined its pool after the probe, cannot run for this plan."""
    from pipeline.planning.probe import probe

    found = probe(settings).toolchain
    if spec.pool not in (CPU_POOL, found.gpu):
        return f"this node's nvidia-smi reports {found.gpu or 'no GPU'}, not {spec.pool}"
    try:
        here = for_build(found, plan.loaded.recipe.toolchain).as_dict()
    except UsageError as exc:
        return str(exc)
    pool = spec.toolchains.for_gpu(spec.pool).as_dict()
    ignored = {"gpu", "sm"} | (set(CPU_POOL_IGNORES) if spec.pool == CPU_POOL else set())
    differ = [f"{k} {here[k]} (pool {pool[k]})" for k in here
              if k not in ignored and here[k] != pool[k]]
    return f"this node has {', '.join(differ)}" if differ else None


def _kill_children_of(pid: int) -> None:
    """SIGKILL the process group of each child of *pid* (the runner makes every child the
    leader of its own group)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(p) for p in (task / "children").read_text().split()]
    for child in found:
        signal_group(child, signal.SIGKILL)


def _stop_children() -> None:
    """Stop every process group this worker started (a cancel may land while the runner is
    between its own SIGTERM and SIGKILL, which would leave a tool running)."""
    from pipeline.host.runner import stop_all
    from pipeline.serving.server import stop_all as stop_servers

    stop_all()
    stop_servers()
    _kill_children_of(os.getpid())


def kill_worker(pid: int) -> None:
    """On a node: kill a worker that answers no cancel (frozen), and its tools' groups."""
    _kill_children_of(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _gpus_ray_assigned() -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES empty while a task Ray gave no GPU runs (module doc)."""
    opted_out = os.environ.get(NOSET, "").lower() in ("1", "true")  # ray/_common env_bool
    if opted_out or ray.get_runtime_context().get_accelerator_ids().get("GPU"):
        yield  # Ray has set it to the task's ids (or the node manages it itself)
        return
    saved = os.environ.get(CUDA_VISIBLE_DEVICES)
    os.environ[CUDA_VISIBLE_DEVICES] = ""
    try:
        yield
    finally:  # the worker process runs later tasks: leave it as Ray started it
        if saved is None:
            os.environ.pop(CUDA_VISIBLE_DEVICES, None)
        else:
            os.environ[CUDA_VISIBLE_DEVICES] = saved


def run_stage(spec: TaskSpec) -> Outcome:
    """One stage run on this node, through the StageWorker every executor uses; with no GPU
    visible when Ray assigned it none."""
    with _gpus_ray_assigned():
        return _run_stage(spec)


def _run_stage(spec: TaskSpec) -> Outcome:
    from pipeline.executors.stage import StageWorker, WorkerSite

    started = time.monotonic()
    node = _node()
    settings = Settings.from_env()  # a Ray task is its node's top: this node's own settings
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
    worker = StageWorker(plan, _context(), settings,
                         WorkerSite(spec.owner, spec.local_gpu, node_id=node["node_id"]),
                         force=spec.force)
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
