"""The Ray executor: each stage run is a Ray task on a node of its pool (`pools.placement`).

    probe_pools  one probe task per node of each needed pool (the toolchain probe, there)
    RayBackend   a `pipeline.executors.dag.Backend`: submits runs with their resources (a
                 run of one group of a split pool also with a label selector naming that
                 group's nodes, `ray.io/node-id in (...)`, so Ray places and retries it there),
                 enforces each stage's timeout from the driver (Ray has none) and cancels,
                 lets Ray retry a run whose node or worker died (system failures only: a
                 stage's own failure is an Outcome, never an exception, so it is not retried)
    ray_tasks    what runs on the nodes: the probe, and one stage run through
                 `pipeline.executors.stage.StageWorker`, the code every executor shares. Bytes
                 travel through the store and the node's fetch cache, never through Ray's
                 object store.

The driver joins the cluster first (`pipeline.executors.ray_cluster.connect`). Only
`pipeline.executors.ray_build` imports this module (after `fleet.require_ray`), so the
local executor never imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.errors import FleetError
from pipeline.executors.groups import NodeProbe
from pipeline.executors.pools import CPU_POOL, NodeInfo, placement, stage_timeout
from pipeline.executors.ray_tasks import TaskSpec, kill_worker, probe_node, run_stage
from pipeline.planning.keys import short_key
from pipeline.planning.outcome import Outcome
from pipeline.planning.plan import Plan
from pipeline.planning.stage_run import StageRun
from pipeline.planning.toolchain import PoolToolchains, from_dict
from registry.context import Context
from registry.errors import EnginectlError, RegistryError
from registry.sql import leases

NODE_ID_LABEL: Final = "ray.io/node-id"
"""The label Ray gives every node (its id), which a task's label selector can ask for."""

WATCH_S: Final = 0.5  # how often the driver looks at deadlines and finished tasks
CANCEL_GRACE_S: Final = float(os.environ.get("ENGINECTL_RAY_CANCEL_GRACE_S", "15"))
"""How long each step of stopping a task past its deadline waits for the task to end:
cancel (KeyboardInterrupt: it stops its children and releases its lease), then force-cancel,
then kill its worker process by pid on its node (a frozen worker answers neither cancel),
then give up on it and report it cancelled."""


def probe_pools(pools: Mapping[str, Sequence[NodeInfo]], *,
                timeout_s: float) -> dict[str, list[NodeProbe]]:
    """Run the toolchain probe on every node of each pool (in parallel, no CPU reserved, so a
    busy node answers too); a node that does not answer in *timeout_s* is an error."""
    remote = ray.remote(probe_node)
    asked: dict[Any, tuple[str, NodeInfo]] = {}
    for pool, nodes in pools.items():
        for node in nodes:
            ref = remote.options(
                num_cpus=0, max_retries=0, name=f"enginectl probe {pool}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote()
            asked[ref] = (pool, node)
    ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s)
    if late:
        pool, node = asked[late[0]]
        for ref in late:
            ray.cancel(ref, force=True)
        raise FleetError(f"node {node.short} of pool {pool} did not answer the toolchain probe "
                         f"in {timeout_s:.0f} s; check it with `ray status`",
                         pools=tuple(pools))
    found: dict[str, list[NodeProbe]] = {pool: [] for pool in pools}
    for ref in ready:
        pool, node = asked[ref]
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as exc:
            why = " ".join(str(exc).split())[:300]
            raise FleetError(f"the toolchain probe failed on node {node.short} of pool "
                             f"{pool}: {why}", pools=tuple(pools)) from exc
        found[pool].append(NodeProbe(node, from_dict(answer["toolchain"]), answer["gpu_name"],
                                     int(answer["gpu_count"]), answer["note"]))
    return found


@dataclass
class _Task:
    run: StageRun
    future: Future[Outcome]
    submitted: float
    timeout_s: float
    deadline: float | None = None  # set once the run holds its lease on a node
    node: dict[str, str] | None = None
    pid: int | None = None  # its worker process, from its stage-run row
    reason: str | None = None  # why the driver cancelled it
    cancelled_at: float | None = None
    steps: int = 0  # how far stopping it went: cancel, force-cancel, kill, give up


@dataclass
class RayBackend:
    """Stage runs of *plan* as tasks on the cluster this driver joined (see `connect`)."""

    plan: Plan
    ctx: Context
    owner: str
    force: bool = False
    probed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    cpu_nodes: Sequence[str] = ()
    grace_s: float = 300.0
    max_retries: int = 3
    toolchains: Mapping[str, PoolToolchains] = field(default_factory=dict)
    """By key: what the run's node plans it with (default: the plan's own)."""
    nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """By key: the only nodes the run may go to (its group's, in a split pool)."""

    def __post_init__(self) -> None:
        self.capacity = max(1, len(self.plan.stages))  # Ray queues; the DAG bounds it
        self._remote = ray.remote(run_stage)
        self._tasks: dict[Any, _Task] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._next_cpu = 0
        self._polled = 0.0
        self._watcher = threading.Thread(target=self._watch, name="ray-watch", daemon=True)
        self._watcher.start()

    def options(self, run: StageRun) -> dict[str, Any]:
        """What *run* asks Ray for."""
        where = placement(self.plan, run)
        opts: dict[str, Any] = {
            "num_cpus": where.num_cpus, "num_gpus": where.num_gpus,
            "resources": dict(where.resources), "max_retries": self.max_retries,
            "retry_exceptions": False, "name": f"enginectl {run.stage} {short_key(run.key)}",
        }
        if where.pool == CPU_POOL and self.cpu_nodes:  # prefer GPU-less nodes, round robin
            node = self.cpu_nodes[self._next_cpu % len(self.cpu_nodes)]
            self._next_cpu += 1
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        only = self.nodes.get(run.key)
        if only:  # Ray labels every node with its id; `in(...)` is a hard constraint
            opts["label_selector"] = {NODE_ID_LABEL: f"in({','.join(sorted(only))})"}
        return opts

    def submit(self, run: StageRun, digests: Mapping[str, str]) -> Future[Outcome]:
        where = placement(self.plan, run)
        spec = TaskSpec(self.plan.loaded, self.toolchains.get(run.key, self.plan.toolchains),
                        run.key, dict(digests), self.owner, self.force, where.pool,
                        None if where.pool == CPU_POOL else where.pool,
                        self.nodes.get(run.key) or self.probed.get(where.pool, frozenset()),
                        source=self.plan.source)
        future: Future[Outcome] = Future()
        future.set_running_or_notify_cancel()
        timeout = stage_timeout(self.plan.loaded.recipe, run) + self.grace_s
        with self._lock:
            ref = self._remote.options(**self.options(run)).remote(spec)
            self._tasks[ref] = _Task(run, future, time.monotonic(), timeout)
            self._lock.notify_all()
        return future

    def wind_down(self) -> None:
        """Nothing new is submitted (the walk stops); runs in flight finish."""

    def stop(self) -> None:
        """Ctrl-C: cancel every task, give each a moment to stop its children and release its
        lease, kill what is left, and record the runs `cancelled`."""
        with self._lock:
            tasks = dict(self._tasks)
            self._tasks.clear()
            self._closed = True
            self._lock.notify_all()
        for ref in tasks:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False)
        if tasks:
            _, left = ray.wait(list(tasks), num_returns=len(tasks), timeout=CANCEL_GRACE_S)
            for ref in left:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        for task in tasks.values():
            self._cancelled(task, "interrupted: the driver was stopped (Ctrl-C)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._watcher.join()

    # the watcher thread: finished tasks, deadlines

    def _watch(self) -> None:
        while True:
            with self._lock:
                while not self._tasks and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                refs = list(self._tasks)
            ready, _ = ray.wait(refs, num_returns=1, timeout=WATCH_S)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self._finish(ref)
            try:
                self._check_deadlines()
            except RegistryError:  # the registry blinked: look again next time
                logging.getLogger(__name__).debug("cannot read stage runs", exc_info=True)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        with self._lock:
            tasks = dict(self._tasks)
        unstarted = {t.run.key: t for t in tasks.values() if t.deadline is None}
        if unstarted and now - self._polled >= 1.0:
            self._polled = now
            with self.ctx.registry.session(readonly=True) as session:
                rows = leases.get_stage_runs(session, set(unstarted))
            for key, row in rows.items():
                if row.owner == self.owner:  # ours, on a node: its clock starts now
                    task = unstarted[key]
                    task.deadline = now + task.timeout_s
                    task.node = {"host": row.host, "node_id": row.node_id or "?"}
                    task.pid = row.pid
        for ref, task in tasks.items():
            if task.deadline is not None and now >= task.deadline and task.reason is None:
                where = f" on {task.node['host']}" if task.node else ""
                task.reason = (f"timed out after {task.timeout_s:.0f} s{where}; cancelled by "
                               "the driver")
                task.cancelled_at = now
                self._escalate(ref, task)
            elif task.cancelled_at is not None \
                    and now - task.cancelled_at >= CANCEL_GRACE_S * task.steps:
                self._escalate(ref, task)

    def _escalate(self, ref: Any, task: _Task) -> None:
        """The next step of stopping a task the driver cancelled."""
        task.steps += 1
        with contextlib.suppress(Exception):
            if task.steps == 1:
                ray.cancel(ref, force=False)
            elif task.steps == 2:
                ray.cancel(ref, force=True)
            elif task.steps == 3 and task.node and task.pid is not None:
                node = NodeAffinitySchedulingStrategy(task.node["node_id"], soft=False)
                ray.remote(kill_worker).options(
                    num_cpus=0, max_retries=0, scheduling_strategy=node,
                    name="enginectl kill a frozen worker").remote(task.pid)
            elif task.steps >= 4:  # its node does not answer either: report, move on
                with self._lock:
                    self._tasks.pop(ref, None)
                assert task.reason is not None  # noqa: S101 - set before the first step
                self._cancelled(task, task.reason)

    def _finish(self, ref: Any) -> None:
        with self._lock:
            task = self._tasks.pop(ref, None)
        if task is None:  # stop() took it
            return
        try:
            outcome = ray.get(ref)
        except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError) as exc:
            if task.reason is None:
                outcome = self._failed(task, f"its worker died {self.max_retries + 1} times: "
                                             f"{_one_line(exc)}")
            else:
                self._cancelled(task, task.reason)
                return
        except ray.exceptions.RayTaskError as exc:  # an exception in the task itself
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            outcome = self._failed(task, _one_line(cause))
        except ray.exceptions.RayError as exc:  # node lost more often than retried, ...
            outcome = self._failed(task, f"lost its node {self.max_retries + 1} times: "
                                         f"{_one_line(exc)}")
        if task.reason is not None and outcome.status not in ("built", "reused"):
            self._cancelled(task, task.reason)
            return
        task.future.set_result(outcome)

    def _failed(self, task: _Task, why: str) -> Outcome:
        run = task.run
        with contextlib.suppress(EnginectlError), self.ctx.registry.session() as session:
            leases.release_lease(session, run.key, owner=self.owner, status="failed",
                                 error=why[:2000])
        return Outcome(run.stage, run.key, "failed", run.targets, node=task.node,
                       seconds=time.monotonic() - task.submitted, error=why)

    def _cancelled(self, task: _Task, why: str) -> None:
        run = task.run
        with contextlib.suppress(EnginectlError), self.ctx.registry.session() as session:
            leases.cancel_run(session, run.key, owner=self.owner, reason=why)
        if not task.future.done():
            task.future.set_result(Outcome(run.stage, run.key, "cancelled", run.targets,
                                           seconds=time.monotonic() - task.submitted,
                                           node=task.node, error=why))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] or type(exc).__name__


@contextlib.contextmanager
def backend(plan: Plan, ctx: Context, **kwargs: Any) -> Iterator[RayBackend]:
    made = RayBackend(plan, ctx, **kwargs)
    try:
        yield made
    finally:
        made.close()
