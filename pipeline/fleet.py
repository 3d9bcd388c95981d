"""fleet: a GPU fleet on Ray — what it has (`enginectl fleet`), and building a recipe on it
(`enginectl build --executor ray`).

A build on the fleet, before anything is submitted:

  preflight  read the cluster's nodes; a target whose GPU SKU no node advertises fails the
             build in seconds (exit 2: the targets, the SKU, the pools there are), or is skipped
             with --keep-going; a SQLite registry is refused when the nodes span machines
  probe      the toolchain probe on every node of each pool the plan needs; a pool whose nodes
             disagree is refused (counts per value); each probe is recorded (`toolchains`:
             pool, fingerprint, host, node), and the pool's fingerprint keys its targets
  walk       the same DAG walk as a local build, on `pipeline.executors.ray.RayBackend`

Ray is imported only here and in `pipeline.executors.ray`, never on a local path.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.build import BuildResult, LiveView, raise_if_interrupted, shown_walk
from pipeline.errors import FleetError
from pipeline.executors.outcome import Outcome
from pipeline.executors.pools import (
    CPU_POOL,
    Fleet,
    NodeProbe,
    disagreement,
    fleet_of,
    missing,
    missing_message,
    nodes_from_ray,
    pool_toolchain,
    resource,
)
from pipeline.executors.stage import lookup
from pipeline.keys import short_key
from pipeline.plan import Plan, plan_recipe
from pipeline.recipe import LoadedRecipe, load_recipe
from pipeline.settings import Settings
from pipeline.toolchain import BUILDER_IMAGE, PoolToolchains, Toolchain, for_build
from registry import records
from registry.context import Context
from registry.errors import UsageError
from registry.lookup import shown

Echo = Callable[[str], None]

PROBE_TIMEOUT_S = float(os.environ.get("ENGINECTL_RAY_PROBE_TIMEOUT_S", "120"))
GRACE_S = float(os.environ.get("ENGINECTL_RAY_TIMEOUT_GRACE_S", "300"))
"""Added to a stage's timeout for what happens around its tool on the node: fetching its
inputs, validating and publishing its output."""
MAX_RETRIES = int(os.environ.get("ENGINECTL_RAY_MAX_RETRIES", "3"))


def _ray() -> Any:
    try:
        from pipeline.executors import ray as ray_executor
    except ImportError as exc:
        raise UsageError("the ray executor needs Ray: pip install 'enginectl[ray]' (the same "
                         f"Ray and Python as the cluster's nodes) ({exc})") from exc
    return ray_executor


def fleet(address: str, *, ctx: Context | None = None) -> dict[str, Any]:
    """The cluster at *address*: per pool its nodes, GPUs total and free, the last probed
    toolchain and when; the CPU nodes; the Ray, Python and enginectl versions."""
    from registry.errors import RegistryError
    from registry.lookup import last_toolchain

    executor = _ray()
    ctx = ctx or Context()
    executor.connect(address, ctx.config)
    try:
        nodes = nodes_from_ray(executor.live_nodes())
        free = executor.free_resources()
    finally:
        executor.disconnect()
    found = fleet_of(nodes)
    url = ctx.config.registry_url
    note = None

    def last(pool: str) -> dict[str, Any] | None:
        nonlocal note
        try:
            probed = last_toolchain(url, pool)
        except RegistryError as exc:
            note = f"cannot read the registry {shown(url)} ({exc})"
            return None
        return None if probed is None else {"toolchain": probed.fingerprint,
                                            "host": probed.host, "probed_at": probed.probed_at}

    pools = [{
        "pool": sku, "resource": resource(sku), "gpus_total": pool.gpus,
        "gpus_free": int(free.get(resource(sku), 0.0)),
        "nodes": [{"node_id": n.node_id, "host": n.host, "address": n.address,
                   "gpus": int(n.resources.get(resource(sku), 0.0))} for n in pool.nodes],
        "last_probe": last(sku),
    } for sku, pool in sorted(found.pools.items())]
    cpu = [{"node_id": n.node_id, "host": n.host, "address": n.address,
            "cpus": n.resources.get("CPU", 0.0)} for n in found.cpu.nodes] \
        if found.cpu_only else []
    return {
        "address": address, "pools": pools, "cpu_nodes": cpu,
        "cpu_last_probe": last(CPU_POOL) if cpu else None,
        "unknown_resources": {name: [n.node_id for n in ns]
                              for name, ns in sorted(found.unknown.items())},
        "versions": {"ray": _version("ray"), "enginectl": _version("enginectl"),
                     "python": ".".join(map(str, sys.version_info[:3]))},
        "note": note,
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fleet_lines(info: Mapping[str, Any]) -> list[str]:
    """`enginectl fleet` for a person."""
    versions = info["versions"]
    title = (f"Ray cluster {info['address']} (Ray {versions['ray']}, Python "
             f"{versions['python']}, enginectl {versions['enginectl']})")
    lines = [title]
    for pool in info["pools"]:
        probe = pool["last_probe"]
        probed = "never probed" if probe is None else (
            f"probed {probe['probed_at']}: " + ", ".join(
                f"{k} {v}" for k, v in probe["toolchain"].items()
                if v and k in ("driver", "cuda", "tensorrt", "trtllm", "image")))
        lines.append(f"  {pool['pool']:<16} {len(pool['nodes'])} nodes, GPUs "
                     f"{pool['gpus_free']}/{pool['gpus_total']} free; {probed}")
        lines += [f"    {n['host']} {n['node_id'][:12]} {n['gpus']} GPUs" for n in pool["nodes"]]
    if info["cpu_nodes"]:
        lines.append(f"  {'CPU':<16} {len(info['cpu_nodes'])} nodes")
        lines += [f"    {n['host']} {n['node_id'][:12]} {n['cpus']:g} CPUs"
                  for n in info["cpu_nodes"]]
    if not info["pools"]:
        lines.append("  no GPU pool: no node advertises a gpu:<SKU> resource (see `ray start "
                     "--resources` in the README)")
    for name, nodes in info["unknown_resources"].items():
        lines.append(f"  ignored: {name} on {len(nodes)} nodes is not a catalog SKU "
                     "(enginectl asks for gpu:<SKU> exactly as the catalog spells it)")
    if info.get("note"):
        lines.append(f"  note: {info['note']}")
    return lines


# --- building on the fleet ----------------------------------------------------------------

def preflight(plan: Plan, found: Fleet, *, keep_going: bool,
              registry_url: str) -> tuple[set[str], str | None]:
    """The targets to skip (their SKU has no node) and the note saying so; FleetError when
    the plan cannot run at all here."""
    if registry_url.startswith("sqlite") and found.machines > 1:
        raise FleetError(f"the registry {shown(registry_url)} is SQLite, but the cluster's "
                         f"nodes are on {found.machines} machines: each would see its own "
                         "file; set ENGINECTL_REGISTRY_URL to the team's PostgreSQL "
                         "(postgresql+psycopg://user@host/db)")
    gaps = missing(plan, found)
    if not gaps:
        return set(), None
    if not keep_going:
        raise FleetError(missing_message(gaps, found, skipped=False), pools=tuple(found.pools))
    skipped = {target for targets in gaps.values() for target in targets}
    if len(skipped) == len(plan.targets):
        raise FleetError(missing_message(gaps, found, skipped=False), pools=tuple(found.pools))
    return skipped, missing_message(gaps, found, skipped=True)


def pool_toolchains(loaded: LoadedRecipe, probes: Mapping[str, list[NodeProbe]]
                    ) -> PoolToolchains:
    """The fingerprint each pool keys its targets with; FleetError when a pool's nodes
    disagree, or contradict a recipe pin."""
    by_pool: dict[str, Toolchain] = {}
    for pool, found in probes.items():
        why = disagreement(pool, found)
        if why is not None:
            raise FleetError(why, pools=tuple(probes))
        try:
            by_pool[pool] = for_build(pool_toolchain(pool, found[0].toolchain),
                                      loaded.recipe.toolchain)
        except UsageError as exc:
            raise FleetError(f"pool {pool}: {str(exc).replace('this machine', 'its nodes')}",
                             pools=tuple(probes)) from exc
    default = by_pool.get(CPU_POOL, BUILDER_IMAGE.pinned(loaded.recipe.toolchain))
    return PoolToolchains(default, by_pool)


def describe(outcome: Outcome) -> str:
    """One line per finished stage run, with the node that ran it."""
    where = outcome.targets[0] + (f" (+{len(outcome.targets) - 1})"
                                  if len(outcome.targets) > 1 else "")
    timing = f" {outcome.seconds:.1f}s" if outcome.status == "built" else ""
    node = ""
    if outcome.node:
        node = f"  on {outcome.node['host']} {outcome.node['node_id'][:12]}"
    why = f": {outcome.error}" if outcome.status in ("failed", "cancelled") else ""
    return (f"{outcome.status:<13} {outcome.stage:<8} {short_key(outcome.key)}  "
            f"{where}{timing}{node}{why}")


class NodeView(LiveView):
    """The local build's live table, each finished run with the node that ran it."""

    def finished(self, outcome: Outcome) -> None:
        super().finished(outcome)
        if outcome.node:
            with self.lock:
                self.state[outcome.key] += (f" on {outcome.node['host']} "
                                            f"{outcome.node['node_id'][:8]}")
                self.live.update(self._table())


def build_on_ray(recipe: Path, *, address: str, only: str | None = None, force: bool = False,
                 keep_going: bool = False, dry_run: bool = False, echo: Echo | None = None,
                 ctx: Context | None = None, loaded: LoadedRecipe | None = None,
                 promote: bool = True, record_probes: bool = True) -> BuildResult:
    """`enginectl build RECIPE --executor ray`: preflight, probe the pools, then run the
    plan's stage runs as Ray tasks (*loaded* and *promote* as `build_recipe` takes them)."""
    from pipeline.executors.local import owner_id
    from pipeline.promote import promote_built

    loaded = loaded or load_recipe(recipe)
    settings = Settings.from_env()
    executor = _ray()
    ctx = ctx or Context()
    executor.connect(address, ctx.config)
    try:
        found = fleet_of(nodes_from_ray(executor.live_nodes()))
        draft = plan_recipe(loaded, settings)  # which SKUs: keys do not matter yet
        skipped, note = preflight(draft, found, keep_going=keep_going,
                                  registry_url=ctx.config.registry_url)
        if note is not None:
            print(f"enginectl: note: {note}", file=sys.stderr)
        wanted = {t.target.gpu.sku for t in draft.targets if t.target.id not in skipped}
        pools = {sku: found.pools[sku].nodes for sku in sorted(wanted) if sku in found.pools}
        if any(t.target.gpu.is_cpu for t in draft.targets):
            pools[CPU_POOL] = found.cpu.nodes
        probes = executor.probe_pools(pools, timeout_s=PROBE_TIMEOUT_S)
        toolchains = pool_toolchains(loaded, probes)
        plan = plan_recipe(loaded, settings, toolchains)
        keys = {key for planned in plan.targets if planned.target.id not in skipped
                and (only is None or fnmatch.fnmatch(planned.target.id, only))
                for key in planned.chain}
        if not keys:
            raise UsageError(f"--only {only!r} matches no target of {recipe} that the "
                             "cluster can build")
        hits = {} if force else lookup(ctx, keys)
        ctx.begin(registry=True)
        result = BuildResult(plan, set(hits),
                             probes={pool: ps[0].toolchain.as_dict()
                                     for pool, ps in probes.items() if ps})
        with ctx.registry.session() as session:
            for pool, found_here in probes.items() if record_probes else ():
                for probe in found_here:
                    records.record_toolchain(session, pool, probe.toolchain.gpu,
                                             probe.toolchain.as_dict(), probe.node.host,
                                             node_id=probe.node.node_id)
        if dry_run:
            return result
        with ctx.registry.session() as session:
            records.record_recipe(session, loaded.digest, loaded.recipe.display_name,
                                  loaded.text)
            records.touch_recipe(session, loaded.digest, loaded.path)
        cpu_nodes = [n.node_id for n in found.cpu.nodes] if found.cpu_only else []
        with executor.backend(plan, ctx, owner=owner_id(), force=force,
                              probed={pool: frozenset(p.node.node_id for p in ps)
                                      for pool, ps in probes.items()},
                              cpu_nodes=cpu_nodes, grace_s=GRACE_S,
                              max_retries=MAX_RETRIES) as backend:
            result.summary = shown_walk(plan, ctx, keys, backend, hits=hits,
                                        keep_going=keep_going, echo=echo, live=None,
                                        view=NodeView, describe=describe)
        raise_if_interrupted(recipe, result.summary)
        if promote:
            result.promotions = promote_built(ctx, plan, result.summary)
        return result
    finally:
        executor.disconnect()
        ctx.close()

