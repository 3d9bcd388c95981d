"""ray_build: building a recipe on a GPU fleet on Ray (`enginectl build --executor ray`).

Before anything is submitted:

  preflight  read the cluster's nodes; a target whose GPU SKU no node advertises fails the
             build in seconds (exit 2: the targets, the SKU, the pools there are), or is skipped
             with --keep-going; a SQLite registry is refused when the nodes span machines
  probe      the toolchain probe on every node of each pool the plan needs; each probe is
             recorded (`toolchains`: pool, fingerprint, host, node; one time per probing),
             and the pool's fingerprint keys its targets. A GPU pool whose nodes report
             different fingerprints (a rolling driver upgrade) is keyed per group of nodes
             that agree: each group builds and smokes its own keys, on its own nodes
             (`pipeline.executors.groups.plan_groups`); CPU nodes that disagree are refused
  walk       the same DAG walk as a local build, on `pipeline.executors.ray.RayBackend`

Ray is imported only after `pipeline.executors.fleet.require_ray`, never on a local path.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import FleetError
from pipeline.executors.fleet import require_ray
from pipeline.executors.groups import (
    Group,
    NodeProbe,
    disagreement,
    group_lines,
    groups_of,
    plan_groups,
)
from pipeline.executors.pools import (
    CPU_POOL,
    Fleet,
    fleet_of,
    missing,
    missing_message,
    nodes_from_ray,
    oversized,
    oversized_error,
    oversized_note,
)
from pipeline.executors.result import (
    BuildOptions,
    BuildResult,
    Planned,
    RayPlanned,
    raise_if_interrupted,
)
from pipeline.executors.stage import lookup
from pipeline.executors.view import NodeView, on_node, walk_and_report
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.planning.source import read_recipe
from pipeline.planning.toolchain import BUILDER_IMAGE, Toolchain, for_build
from pipeline.recipe.reader import LoadedRecipe
from pipeline.settings import Settings
from registry.config import masked_url
from registry.context import Context
from registry.errors import UsageError
from registry.sql import build_inputs
from registry.sql.models import utcnow

PROBE_TIMEOUT_S = float(os.environ.get("ENGINECTL_RAY_PROBE_TIMEOUT_S", "120"))
GRACE_S = float(os.environ.get("ENGINECTL_RAY_TIMEOUT_GRACE_S", "300"))
"""Added to a stage's timeout for what happens around its tool on the node: fetching its
inputs, validating and publishing its output."""
MAX_RETRIES = int(os.environ.get("ENGINECTL_RAY_MAX_RETRIES", "3"))


def preflight(plan: Plan, found: Fleet, *, keep_going: bool,
              registry_url: str) -> tuple[set[str], str | None]:
    """The targets to skip (their SKU has no node, or none of its nodes has the GPUs they
    ask one node for) and the note saying so; FleetError (a SKU no node has) or MachineError
    (too few GPUs on every node, exit 3) when the plan cannot run here without skipping, or
    at all."""
    if registry_url.startswith("sqlite") and found.machines > 1:
        raise FleetError(f"the registry {masked_url(registry_url)} is SQLite, but the cluster's "
                         f"nodes are on {found.machines} machines: each would see its own "
                         "file; set ENGINECTL_REGISTRY_URL to the team's PostgreSQL "
                         "(postgresql+psycopg://user@host/db)")
    gaps = missing(plan, found)
    big = oversized(plan, found)
    if not gaps and not big:
        return set(), None
    skipped = {target for targets in gaps.values() for target in targets}
    if gaps and (not keep_going or len(skipped) == len(plan.targets)):
        raise FleetError(missing_message(gaps, found, skipped=False), pools=tuple(found.pools))
    if big and (not keep_going or len(skipped | set(big)) == len(plan.targets)):
        raise oversized_error(big)
    notes = [missing_message(gaps, found, skipped=True)] if gaps else []
    notes += [oversized_note(big)] if big else []
    return skipped | set(big), "; ".join(notes)


def pool_toolchains(loaded: LoadedRecipe, probes: Mapping[str, list[NodeProbe]]
                    ) -> tuple[Toolchain, dict[str, list[tuple[Group, Toolchain]]], list[str]]:
    """The fingerprint of the CPU pool (what every target without a GPU pool keys with), each
    GPU pool's groups with the fingerprint each keys its targets with, and notes (a group
    whose nodes contradict a recipe pin is left out). FleetError when a node's GPU is not
    its pool's, the CPU nodes disagree, or no group of a pool holds the recipe's pins."""
    keyed: dict[str, list[tuple[Group, Toolchain]]] = {}
    notes: list[str] = []
    for pool, found in probes.items():
        why = disagreement(pool, found)
        if why is not None:
            raise FleetError(why, pools=tuple(probes))
        groups = groups_of(pool, [(p.toolchain, p.node.node_id, p.node.host) for p in found])
        refused: list[str] = []
        for group, line in zip(groups, group_lines(groups), strict=True):
            try:
                keyed.setdefault(pool, []).append(
                    (group, for_build(group.toolchain, loaded.recipe.toolchain)))
            except UsageError as exc:
                refused.append(f"pool {pool}: {str(exc).replace('this machine', 'its nodes')}"
                               + (f" ({line})" if len(groups) > 1 else ""))
        if pool not in keyed and refused:
            raise FleetError(refused[0], pools=tuple(probes))
        notes += [f"{why}; that group builds nothing" for why in refused]
    cpu = keyed.pop(CPU_POOL, None)
    default = cpu[0][1] if cpu else BUILDER_IMAGE.pinned(loaded.recipe.toolchain)
    for pool, split in sorted(keyed.items()):
        if len(split) > 1:
            notes.append(f"pool {pool} is split ({'; '.join(group_lines([g for g, _ in split]))}"
                         "): each group builds and smokes its own keys on its own nodes")
    return default, keyed, notes


def _first_group(probes: Mapping[str, list[NodeProbe]],
                 keyed: Mapping[str, list[tuple[Group, Toolchain]]]) -> dict[str, Any]:
    """Each pool's probe as the build reports it: a node of its first (largest) group."""
    found: dict[str, Any] = {}
    for pool, nodes in probes.items():
        first = keyed.get(pool)
        chosen = [p for p in nodes if first and p.node.node_id in first[0][0].nodes] or nodes
        if chosen:
            found[pool] = chosen[0].toolchain.as_dict()
    return found


def build_on_ray(recipe: Path, *, ctx: Context, settings: Settings, options: BuildOptions,
                 loaded: LoadedRecipe | None = None,
                 planned: Planned | None = None) -> BuildResult:
    """`enginectl build RECIPE --executor ray`: preflight, probe the pools, then run the
    plan's stage runs as Ray tasks on the cluster at `options.address` (*options*, *loaded*
    and *planned* as `build_recipe` takes them: with *planned*, nothing is probed, recorded
    or planned again; probes are recorded unless `options.record_probes` is False)."""
    from pipeline.executors.local import owner_id
    from pipeline.serving.promote import promote_built

    given = None if planned is None else planned.on_ray
    if given is None:
        loaded = loaded or read_recipe(recipe)
    require_ray()  # after the recipe: a bad recipe is said first, with or without Ray
    from pipeline.executors.ray import backend
    from pipeline.executors.ray_cluster import connect, disconnect

    connect(options.address, ctx.config)
    try:
        on_ray = given or _plan_on_ray(loaded or read_recipe(recipe), ctx, settings,
                                       keep_going=options.keep_going)
        plan = on_ray.grouped.plan
        keys = {key for planned_target in plan.targets
                if planned_target.target.id not in on_ray.skipped
                and (options.only is None
                     or fnmatch.fnmatch(planned_target.target.id, options.only))
                for key in planned_target.chain}
        if not keys:
            raise UsageError(f"--only {options.only!r} matches no target of {recipe} that the "
                             "cluster can build")
        hits = {} if options.force else lookup(ctx, keys)
        ctx.begin(registry=True)
        result = BuildResult(plan, set(hits), probes=dict(on_ray.reported),
                             planned=Planned(plan, on_ray=on_ray))
        probed_at = utcnow()  # one time per probing: `plan` reads a pool's groups by it
        recording = options.record_probes is not False and given is None
        with ctx.registry.session() as session:
            for pool, found_here in on_ray.probes.items() if recording else ():
                for probe in found_here:
                    build_inputs.record_toolchain(session, pool, probe.toolchain.gpu,
                                                  probe.toolchain.as_dict(), probe.node.host,
                                                  node_id=probe.node.node_id, probed_at=probed_at)
        if options.dry_run:
            return result
        loaded = plan.loaded
        with ctx.registry.session() as session:
            build_inputs.record_recipe(session, loaded.digest, loaded.recipe.display_name,
                                       loaded.text)
            build_inputs.touch_recipe(session, loaded.digest, loaded.path)
        grouped = on_ray.grouped
        with backend(plan, ctx, owner=owner_id(), force=options.force,
                     probed={pool: frozenset(p.node.node_id for p in ps)
                             for pool, ps in on_ray.probes.items()},
                     toolchains=grouped.toolchains, nodes=grouped.nodes,
                     cpu_nodes=list(on_ray.cpu_nodes), grace_s=GRACE_S,
                     max_retries=MAX_RETRIES) as on_cluster:
            result.summary = walk_and_report(plan, ctx, keys, on_cluster, hits=hits,
                                             keep_going=options.keep_going, echo=options.echo,
                                             live=None, view=NodeView, line=on_node)
        raise_if_interrupted(recipe, result.summary)
        if options.promote:
            result.promotions = promote_built(ctx, plan, result.summary)
        return result
    finally:
        disconnect()


def _plan_on_ray(loaded: LoadedRecipe, ctx: Context, settings: Settings, *,
                 keep_going: bool) -> RayPlanned:
    """Preflight against the cluster's live nodes, probe the pools the recipe needs and plan
    it per group of nodes (the module doc); its notes are said on stderr."""
    from pipeline.executors.ray import probe_pools
    from pipeline.executors.ray_cluster import live_nodes

    found = fleet_of(nodes_from_ray(live_nodes()))
    draft = plan_recipe(loaded, settings)  # which SKUs: keys do not matter yet
    skipped, note = preflight(draft, found, keep_going=keep_going,
                              registry_url=ctx.config.registry_url)
    if note is not None:
        print(f"enginectl: note: {note}", file=sys.stderr)
    wanted = {t.target.gpu.sku for t in draft.targets if t.target.id not in skipped}
    pools = {sku: found.pools[sku].nodes for sku in sorted(wanted) if sku in found.pools}
    if any(t.target.gpu.is_cpu for t in draft.targets):
        pools[CPU_POOL] = found.cpu.nodes
    probes = probe_pools(pools, timeout_s=PROBE_TIMEOUT_S)
    default, keyed, notes = pool_toolchains(loaded, probes)
    for line in notes:
        print(f"enginectl: note: {line}", file=sys.stderr)
    grouped = plan_groups(loaded, settings, default, keyed)
    cpu_nodes = tuple(n.node_id for n in found.cpu.nodes) if found.cpu_only else ()
    return RayPlanned(grouped, probes, _first_group(probes, keyed), frozenset(skipped),
                      cpu_nodes)
