"""Groups: what keys a Ray pool's targets, from the toolchain probes of its nodes. Pure.

Each node of a pool the plan needs is probed (`NodeProbe`); a node whose GPU is not its pool's
SKU, or CPU nodes that differ in what CPU work depends on, are refused (`disagreement`). A
pool's fingerprint keys its targets; a GPU pool whose nodes report different fingerprints (a
rolling driver upgrade, half its nodes done) is split into **groups**, one per fingerprint
(`groups_of`): each target on it is planned once per group (`plan_groups`), and each group's
runs are placed on that group's nodes alone (`GroupedPlan.nodes`, a Ray label selector on
`ray.io/node-id`). The CPU pool's nodes must agree, except in what CPU work does not depend on
(`CPU_POOL_IGNORES`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.executors.pools import CPU_POOL, NodeInfo, placement, resource
from pipeline.planning.plan import Plan, PlannedTarget, plan_recipe
from pipeline.planning.stage_run import StageRun
from pipeline.planning.toolchain import PoolToolchains, Toolchain
from pipeline.recipe.reader import LoadedRecipe
from pipeline.settings import Settings

CPU_POOL_IGNORES: Final = ("gpu", "sm", "driver", "driver_cuda", "cuda")
"""Fields CPU work does not depend on: the CPU pool's nodes may differ in them."""



@dataclass(frozen=True)
class NodeProbe:
    """What the toolchain probe found on one node."""

    node: NodeInfo
    toolchain: Toolchain
    gpu_name: str | None
    gpu_count: int
    note: str | None = None


def disagreement(pool: str, probes: Sequence[NodeProbe]) -> str | None:
    """Why *pool*'s nodes cannot key its targets (None when they can): a node whose GPU is
    not the pool's SKU, or CPU nodes that differ in a field CPU work depends on (with counts
    per value). GPU nodes that differ in their fingerprint are groups, not an error."""
    if pool != CPU_POOL:
        for probe in probes:
            if probe.toolchain.gpu != pool:
                seen = probe.gpu_name or "no GPU"
                return (f"node {probe.node.short} advertises {resource(pool)} but its "
                        f"nvidia-smi reports {seen!r}; fix the node's --resources")
        return None
    ignored = CPU_POOL_IGNORES
    differing = []
    for name, _ in probes[0].toolchain.as_dict().items() if probes else ():
        if name in ignored:
            continue
        counts = Counter(str(p.toolchain.as_dict()[name]) for p in probes)
        if len(counts) > 1:
            each = ", ".join(f"{value} on {count} node{'s' if count > 1 else ''}"
                             for value, count in sorted(counts.items()))
            differing.append(f"{name} {each}")
    if not differing:
        return None
    return (f"pool {pool}: its {len(probes)} nodes disagree ({'; '.join(differing)}), so its "
            "keys would be ambiguous; bring every node of the pool to one toolchain "
            "(`enginectl fleet` shows the last probes)")


def pool_toolchain(pool: str, probed: Toolchain) -> Toolchain:
    """The fingerprint a pool's targets are keyed with, from one of its (agreeing) nodes."""
    if pool != CPU_POOL:
        return probed
    values = probed.as_dict()
    for name in CPU_POOL_IGNORES:
        values[name] = None
    return Toolchain(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Group:
    """The nodes of a GPU pool that report one fingerprint."""

    pool: str
    toolchain: Toolchain  # as the pool keys with it (`pool_toolchain`)
    nodes: tuple[str, ...]  # Ray node ids
    hosts: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "toolchain": self.toolchain.as_dict(),
                "nodes": list(self.nodes), "hosts": list(self.hosts)}


def groups_of(pool: str, found: Iterable[tuple[Toolchain, str, str]]) -> list[Group]:
    """The groups of *pool* from (fingerprint, node id, host) per node: one per fingerprint,
    the one with the most nodes first (then by fingerprint, so the order is stable)."""
    by_print: dict[str, list[tuple[Toolchain, str, str]]] = {}
    for toolchain, node_id, host in found:
        keyed = pool_toolchain(pool, toolchain)
        by_print.setdefault(repr(sorted(keyed.as_dict().items(), key=str)), []).append(
            (keyed, node_id, host))
    ordered = sorted(by_print.items(), key=lambda item: (-len(item[1]), item[0]))
    return [Group(pool, members[0][0], tuple(n for _, n, _ in members),
                  tuple(h for _, _, h in members)) for _, members in ordered]


def group_lines(groups: Sequence[Group]) -> list[str]:
    """Each group of one pool in words: the fields in which the groups differ, and where."""
    values = [g.toolchain.as_dict() for g in groups]
    differ = [name for name in values[0] if len({str(v[name]) for v in values}) > 1]
    lines = []
    for group, fingerprint in zip(groups, values, strict=True):
        what = ", ".join(f"{name} {fingerprint[name]}" for name in differ) or "one fingerprint"
        count = f"{len(group.nodes)} node{'s' if len(group.nodes) != 1 else ''}"
        lines.append(f"{what} on {count} ({', '.join(sorted(set(group.hosts)))})")
    return lines


@dataclass
class GroupedPlan:
    """A plan over pools that may have several groups: every group's stage runs, merged."""

    plan: Plan  # what the walk runs: a target appears once per group of its pool
    toolchains: dict[str, PoolToolchains]  # by key: what the run's node plans it with
    nodes: dict[str, frozenset[str]]  # by key: the only nodes it may run on, if restricted
    groups: dict[str, list[Group]]  # by pool
    group_keys: dict[tuple[str, int], list[str]]  # (pool, group index): its targets' keys


def plan_groups(loaded: LoadedRecipe, settings: Settings, default: Toolchain,
                keyed: Mapping[str, Sequence[tuple[Group, Toolchain]]]) -> GroupedPlan:
    """Plan *loaded* once per group depth: the i-th plan keys each pool's targets with its
    i-th group's toolchain (*keyed*: each group with the toolchain it keys with, pins
    applied), every other target with *default*. The runs are merged by key; a run on a GPU
    pool that not all of its groups plan may only run on the nodes of those that do."""
    depth = max((len(groups) for groups in keyed.values()), default=1)
    plans = [plan_recipe(loaded, settings, PoolToolchains(default, {
        sku: groups[min(index, len(groups) - 1)][1] for sku, groups in keyed.items()}))
        for index in range(depth)]
    grouped = GroupedPlan(plans[0], {}, {}, {sku: [g for g, _ in groups]
                                              for sku, groups in keyed.items()}, {})
    stages: dict[str, StageRun] = {}
    targets: list[PlannedTarget] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    allowed: dict[tuple[str, str], set[str]] = {}
    for index, plan in enumerate(plans):
        for planned in plan.targets:
            sku, groups = planned.target.gpu.sku, keyed.get(planned.target.gpu.sku, ())
            if index > 0 and len(groups) <= index:
                continue  # its pool has no group this deep: the first plan has it
            if groups:
                grouped.group_keys.setdefault((sku, index), []).extend(planned.chain)
            if (planned.target.id, tuple(planned.chain)) not in seen:
                seen.add((planned.target.id, tuple(planned.chain)))
                targets.append(planned)
            for key in planned.chain:
                grouped.toolchains.setdefault(key, plan.toolchains)
                if groups:
                    allowed.setdefault((key, sku), set()).update(groups[index][0].nodes)
                run = stages.setdefault(key, plan.stages[key])
                run.targets += [t for t in plan.stages[key].targets if t not in run.targets]
    if depth > 1:
        first = plans[0]
        grouped.plan = Plan(loaded, first.toolchains, targets, stages, first.channels,
                            source=first.source)
    for key, run in grouped.plan.stages.items():
        pool = placement(grouped.plan, run).pool
        every = {n for group in grouped.groups.get(pool, ()) for n in group.nodes}
        only = allowed.get((key, pool))
        if only is not None and only != every:
            grouped.nodes[key] = frozenset(only)
    return grouped
