"""fleet: a GPU fleet on Ray — what it has (`enginectl fleet`), and whether this machine can
join it at all (`require_ray`). Building a recipe on it is `pipeline.executors.ray_build`'s.

Ray is imported only in `pipeline.executors.ray_cluster`, `.ray` and `.ray_tasks`, which only
this module and `.ray_build` import (after `require_ray`), never on a local path.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from pipeline.executors.groups import group_lines, groups_of
from pipeline.executors.pools import CPU_POOL, fleet_of, nodes_from_ray, resource
from pipeline.planning.toolchain import from_dict
from registry.config import masked_url
from registry.errors import UsageError

if TYPE_CHECKING:
    from registry.context import Context


def require_ray() -> None:
    """UsageError, saying how to install it, when Ray cannot be imported here."""
    try:
        import pipeline.executors.ray
        import pipeline.executors.ray_cluster  # noqa: F401 - what the callers import next
    except ImportError as exc:
        raise UsageError("the ray executor needs Ray: pip install 'enginectl[ray]' (the same "
                         f"Ray and Python as the cluster's nodes) ({exc})") from exc


def fleet(address: str, *, ctx: Context) -> dict[str, Any]:
    """The cluster at *address*: per pool its nodes, GPUs total and free, the last probed
    toolchain and when, and the groups of nodes that last probing found (several when the
    nodes differ, e.g. mid driver upgrade); the CPU nodes; the Ray, Python and enginectl
    versions."""
    from registry.errors import RegistryError
    from registry.sql.lookup import Probed, recorded_pools

    require_ray()
    from pipeline.executors.ray_cluster import connect, disconnect, free_resources, live_nodes

    connect(address, ctx.config)
    try:
        nodes = nodes_from_ray(live_nodes())
        free = free_resources()
    finally:
        disconnect()
    found = fleet_of(nodes)
    url = ctx.config.registry_url
    note = None
    rounds: dict[str, list[Probed]] = {}
    try:  # a Ray pool's last probing: every node it probed, with one time
        for probed in recorded_pools(url):
            if not probed.pool.startswith("host:"):
                rounds.setdefault(probed.pool, []).append(probed)
    except RegistryError as exc:
        note = f"cannot read the registry {masked_url(url)} ({exc})"

    def last(pool: str) -> dict[str, Any] | None:
        found = rounds.get(pool)
        if not found:
            return None
        groups = groups_of(pool, [(from_dict(p.fingerprint), p.node_id or "?", p.host)
                                  for p in found])
        return {"toolchain": found[0].fingerprint, "host": found[0].host,
                "probed_at": found[0].probed_at,
                "groups": [{**g.as_dict(), "line": line}
                           for g, line in zip(groups, group_lines(groups), strict=True)]}

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
        groups = [] if probe is None else probe["groups"]
        if len(groups) > 1:
            lines.append(f"    split into {len(groups)} groups, each keyed, built and smoked "
                         "on its own:")
            lines += [f"      group {n}: {g['line']}" for n, g in enumerate(groups, 1)]
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
