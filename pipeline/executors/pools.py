"""Pools and placement on a Ray cluster: pure decisions over plain values (Ray is not imported).

A **pool** is the set of nodes that advertise the custom resource `gpu:<catalog SKU>` (one unit
per GPU, e.g. `gpu:H100-SXM5-80GB: 8`), plus the CPU pool: the nodes that advertise none
(every node, when the cluster has no such node). Where each stage run goes:

    build (engine), smoke of a GPU target   tp × pp units of its SKU and as many GPUs, one node
                                            (no node has that many: refused up front,
                                            `oversized`; Ray would leave it pending)
    quantize                                the GPUs its calibration needs on its SKU's pool
                                            (a CPU-only recipe: the CPU pool)
    convert                                 its target's pool (TRT-LLM lives in the builder
                                            image there), no GPU: a sliver of the SKU's
                                            resource pins it to the pool
    snapshot, no-build entries, CPU smoke   the CPU pool

The driver checks every pool a plan needs exists before submitting anything (`missing`), and
that one node of it has the GPUs each run asks for (`oversized`). What keys a pool's targets
(its nodes' toolchain probes, and groups of them) is `pipeline.executors.groups`'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.errors import MachineError
from pipeline.planning.capacity import GpuNeed, NodeGpus, Shortfall, run_need, shortfall
from pipeline.planning.plan import KIND_ENGINE, Plan
from pipeline.planning.stage_run import StageRun
from pipeline.recipe.schema import Recipe
from registry.gpus import UnknownGpuError, lookup_gpu

GPU_PREFIX: Final = "gpu:"
CPU_POOL: Final = "CPU"
PIN: Final = 0.001
"""The share of a SKU's resource a GPU-less run (convert) asks for: it pins the run to the
pool without holding a GPU (Ray's resource granularity is 0.0001)."""

def resource(sku: str) -> str:
    """The Ray resource a node of pool *sku* advertises, one unit per GPU."""
    return f"{GPU_PREFIX}{sku}"


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    host: str
    address: str
    resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return f"{self.host}/{self.node_id[:8]}"

    def gpu_resources(self) -> dict[str, float]:
        return {name: amount for name, amount in self.resources.items()
                if name.startswith(GPU_PREFIX)}


def nodes_from_ray(entries: Iterable[Mapping[str, Any]]) -> list[NodeInfo]:
    """The live nodes of `ray.nodes()`'s answer."""
    return [
        NodeInfo(str(e["NodeID"]), str(e.get("NodeManagerHostname") or "?"),
                 str(e.get("NodeManagerAddress") or "?"),
                 {str(k): float(v) for k, v in (e.get("Resources") or {}).items()})
        for e in entries if e.get("Alive")
    ]


@dataclass(frozen=True)
class Pool:
    name: str  # a catalog SKU, or CPU_POOL
    nodes: tuple[NodeInfo, ...]

    @property
    def gpus(self) -> int:
        if self.name == CPU_POOL:
            return 0
        return int(sum(n.resources.get(resource(self.name), 0.0) for n in self.nodes))


@dataclass(frozen=True)
class Fleet:
    """The cluster as the planner sees it."""

    pools: Mapping[str, Pool]  # GPU pools by SKU
    cpu: Pool  # CPU nodes (every node when none is GPU-less)
    cpu_only: bool  # whether `cpu` holds only GPU-less nodes
    unknown: Mapping[str, tuple[NodeInfo, ...]]  # gpu:<name> resources not in the catalog

    @property
    def machines(self) -> int:
        """How many machines the nodes are on (by address)."""
        nodes = [n for pool in self.pools.values() for n in pool.nodes] + list(self.cpu.nodes)
        return len({n.address for n in nodes})

    def names(self) -> str:
        shown = [f"{sku} ({len(p.nodes)} nodes, {p.gpus} GPUs)"
                 for sku, p in sorted(self.pools.items())]
        if self.cpu_only:
            shown.append(f"CPU ({len(self.cpu.nodes)} nodes)")
        return ", ".join(shown) or "none"


def fleet_of(nodes: Sequence[NodeInfo]) -> Fleet:
    """Group live *nodes* into pools by the `gpu:<SKU>` resources they advertise."""
    by_sku: dict[str, list[NodeInfo]] = {}
    unknown: dict[str, list[NodeInfo]] = {}
    plain: list[NodeInfo] = []
    for node in nodes:
        gpus = node.gpu_resources()
        if not gpus:
            plain.append(node)
        for name in gpus:
            sku = name.removeprefix(GPU_PREFIX)
            try:
                canonical = lookup_gpu(sku).sku
            except UnknownGpuError:
                canonical = None
            if canonical == sku:
                by_sku.setdefault(sku, []).append(node)
            else:  # `gpu:h100` is not the name enginectl asks for: say so, never guess
                unknown.setdefault(name, []).append(node)
    return Fleet(
        {sku: Pool(sku, tuple(found)) for sku, found in by_sku.items()},
        Pool(CPU_POOL, tuple(plain or nodes)), bool(plain),
        {name: tuple(found) for name, found in unknown.items()},
    )


@dataclass(frozen=True)
class Placement:
    pool: str  # the pool whose nodes run it (a SKU, or CPU_POOL)
    num_gpus: int = 0
    resources: Mapping[str, float] = field(default_factory=dict)
    num_cpus: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "num_gpus": self.num_gpus, "num_cpus": self.num_cpus,
                "resources": dict(self.resources)}


def placement(plan: Plan, run: StageRun) -> Placement:
    """Where *run* executes and what it asks the cluster for."""
    on_gpu = run.gpu not in (None, CPU_POOL)
    if run.stage == "convert":
        sku = plan.target(run.targets[0]).gpu.sku
        return Placement(sku, 0, {resource(sku): PIN})
    if run.gpu is not None and on_gpu and (
        (run.stage == "build" and run.kind == KIND_ENGINE)
        or (run.stage in ("smoke", "quantize") and run.gpus > 0)
    ):
        units = max(1, run.gpus)
        return Placement(run.gpu, units, {resource(run.gpu): float(units)})
    return Placement(CPU_POOL)


def needed(plan: Plan, keys: Iterable[str]) -> dict[str, list[str]]:
    """The GPU pools the runs among *keys* need, each with the targets that need it."""
    wanted: dict[str, list[str]] = {}
    for key in keys:
        run = plan.stages[key]
        pool = placement(plan, run).pool
        if pool != CPU_POOL:
            for target in run.targets:
                if target not in wanted.setdefault(pool, []):
                    wanted[pool].append(target)
    return wanted


def targets_on(plan: Plan, sku: str) -> list[str]:
    """Every target of *plan* on GPU *sku*."""
    return [t.target.id for t in plan.targets if t.target.gpu.sku == sku]


def missing(plan: Plan, fleet: Fleet) -> dict[str, list[str]]:
    """The GPU SKUs *plan*'s targets use that no node advertises, with those targets."""
    skus = {t.target.gpu.sku for t in plan.targets if not t.target.gpu.is_cpu}
    return {sku: targets_on(plan, sku) for sku in sorted(skus) if sku not in fleet.pools}


def missing_message(gaps: Mapping[str, list[str]], fleet: Fleet, *, skipped: bool) -> str:
    """One line: which targets need which SKU no node has, and the pools there are."""
    parts = []
    for sku, targets in gaps.items():
        shown = ", ".join(targets[:3]) + (f" (+{len(targets) - 3})" if len(targets) > 3 else "")
        count = "1 target needs" if len(targets) == 1 else f"{len(targets)} targets need"
        parts.append(f"no node advertises {resource(sku)}, which {count} ({shown})")
    pools = f"the cluster has: {fleet.names()}"
    if skipped:
        return f"skipping the targets no node can run: {'; '.join(parts)}; {pools}"
    return (f"{'; '.join(parts)}; {pools}; add nodes with `ray start --resources "
            f"'{{\"{resource(next(iter(gaps)))}\": N}}'`, or pass --keep-going to skip them")


def oversized(plan: Plan, fleet: Fleet) -> dict[str, Shortfall]:
    """The targets of *plan* with a run that asks one node of its pool for more GPUs than
    the largest node of that pool advertises, each with why (`pipeline.planning.capacity`);
    pools no node advertises are `missing`'s."""
    found: dict[str, Shortfall] = {}
    for run in plan.stages.values():
        where = placement(plan, run)
        pool = fleet.pools.get(where.pool)
        if pool is None or where.num_gpus <= 0:
            continue
        largest = max(int(node.resources.get(resource(pool.name), 0.0)) for node in pool.nodes)
        need = run_need(plan, run) or GpuNeed(pool.name, where.num_gpus, f"its {run.stage}")
        short = shortfall(need, NodeGpus(pool.name, largest,
                                         where=f"the largest node of pool {pool.name}",
                                         source=f"its {resource(pool.name)} resource"))
        if short is not None:
            for target in run.targets:
                found.setdefault(target, short)
    return found


def _oversized_reasons(found: Mapping[str, Shortfall]) -> str:
    shown = "; ".join(f"target {target}: {short.reason}"
                      for target, short in list(found.items())[:3])
    return shown + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")


def oversized_note(found: Mapping[str, Shortfall]) -> str:
    """The note of a keep-going build that skips *found*."""
    return f"skipping the targets no node has the GPUs for: {_oversized_reasons(found)}"


def oversized_error(found: Mapping[str, Shortfall]) -> MachineError:
    """The refusal (exit 3) of a build with targets no node has the GPUs for."""
    first = next(iter(found.values()))
    count = f"{len(found)} target{'s' if len(found) > 1 else ''}"
    return MachineError(f"no node of the Ray cluster has the GPUs for {count}",
                        _oversized_reasons(found), f"{first.fix} (`ray start --resources`), "
                        "or pass --keep-going to skip them")


def stage_timeout(recipe: Recipe, run: StageRun) -> float:
    """How long the driver lets *run* take on its node before cancelling it: the recipe's
    timeout for that stage (a smoke run: ready, then every check and load request)."""
    if run.stage == "quantize":
        return float(recipe.quantize.timeout_s)
    if run.stage == "smoke":
        smoke = recipe.smoke
        requests = sum(math.ceil(smoke.requests / c) for c in smoke.concurrency)
        return float(smoke.ready_timeout_s + smoke.request_timeout_s * (5 + requests))
    return float(recipe.build.timeout_s)
