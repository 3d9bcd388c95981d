"""preview: what `enginectl plan` shows — the plan keyed as a build would key it, and which of
its stages the registry already has.

A build keys every stage with the toolchain it probes on the pool that runs it; `plan` runs
nothing, so it uses the toolchain last recorded for that pool (`build` records each probe)
and falls back to the builder image's versions, saying so. The registry is read with its
database driver alone (`registry.lookup`), never created or migrated, and a registry that
cannot be read only costs the "built" column, with a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pipeline.plan import Plan, plan_recipe
from pipeline.recipe import LoadedRecipe
from pipeline.settings import Settings
from pipeline.toolchain import (
    BUILDER_IMAGE,
    FIELDS,
    Toolchain,
    for_plan,
    from_dict,
    local_pool,
)
from registry.errors import RegistryError, UsageError
from registry.lookup import built_keys, last_toolchain, shown


@dataclass
class Preview:
    plan: Plan
    built: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    toolchain_source: str = "builder image"
    """Where the plan's toolchain came from: "<pool> probed <time>" or "builder image"."""


OVERRIDABLE: Final = tuple(name for name in FIELDS if name not in ("gpu", "sm"))


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """`driver=575.57.08` items as {field: value}; UsageError naming a bad item."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise UsageError(f"--toolchain {item!r}: expected FIELD=VALUE, e.g. "
                             "driver=575.57.08")
        if name not in OVERRIDABLE:
            raise UsageError(f"--toolchain {item!r}: unknown field {name!r}; one of "
                             f"{', '.join(OVERRIDABLE)}")
        found[name] = value.strip()
    return found


def _bumped(toolchain: Toolchain, overrides: Mapping[str, str]) -> Toolchain:
    values: dict[str, Any] = dict(overrides)
    return replace(toolchain, **values) if values else toolchain


def preview(loaded: LoadedRecipe, settings: Settings, *, registry_url: str,
            pools: str = "local", overrides: Mapping[str, str] | None = None) -> Preview:
    """The plan of *loaded* for a build on this machine (the local executor's pool), or, with
    *pools* "ray", on a Ray cluster's pools (each target's SKU its own); *overrides* replace
    fields of every pool's fingerprint (what-if: `plan --toolchain driver=…`)."""
    overrides = overrides or {}
    if pools == "ray":
        return _on_ray_pools(loaded, settings, registry_url, overrides)
    notes: list[str] = []
    pool = local_pool()
    try:
        probed = last_toolchain(registry_url, pool)
    except RegistryError as exc:
        probed = None
        notes.append(f"cannot read the registry ({exc}); keys use the builder image's versions "
                     "and nothing is shown as built")
    if probed is None:
        toolchain, source = BUILDER_IMAGE, "builder image"
        if not notes:
            notes.append(f"no toolchain is recorded for {pool} in {shown(registry_url)}; keys "
                         "use the builder image's versions (`enginectl build` records this "
                         "machine's)")
    else:
        toolchain, note = for_plan(from_dict(probed.fingerprint), loaded.recipe.toolchain)
        source = f"{pool} probed {probed.probed_at}"
        if note:
            notes.append(note)
    plan = plan_recipe(loaded, settings, _bumped(toolchain, overrides))
    result = Preview(plan, notes=notes, toolchain_source=source)
    if not notes or probed is not None:
        try:
            result.built = built_keys(registry_url, set(plan.stages))
        except RegistryError as exc:
            notes.append(f"cannot read the registry ({exc}); nothing is shown as built")
    return result


def _on_ray_pools(loaded: LoadedRecipe, settings: Settings, registry_url: str,
                  overrides: Mapping[str, str]) -> Preview:
    """Each target keyed with its Ray pool's last recorded probe (pool = the catalog SKU;
    CPU targets and stages on CPU nodes: the CPU pool's, else the builder image's), as a
    build with `--executor ray` keys it after probing; the cluster is not contacted."""
    from pipeline.executors.pools import CPU_POOL, pool_toolchain
    from pipeline.toolchain import PoolToolchains

    notes: list[str] = []
    draft = plan_recipe(loaded, settings)
    names = sorted({t.target.gpu.sku for t in draft.targets})
    by_pool: dict[str, Toolchain] = {}
    sources: list[str] = []
    never: list[str] = []
    for pool in names:
        try:
            probed = last_toolchain(registry_url, pool)
        except RegistryError as exc:
            notes.append(f"cannot read the registry ({exc}); keys use the builder image's "
                         "versions and nothing is shown as built")
            break
        if probed is None:
            never.append(pool)
            continue
        recorded = pool_toolchain(pool, from_dict(probed.fingerprint))
        by_pool[pool], note = for_plan(recorded, loaded.recipe.toolchain)
        sources.append(f"{pool} probed {probed.probed_at}")
        if note:
            notes.append(f"pool {pool}: {note}")
    if never and not notes:
        notes.append(f"no probe is recorded for the Ray pools {', '.join(never)} in "
                     f"{shown(registry_url)}; their keys use the builder image's versions "
                     "(`enginectl build --executor ray` probes and records them)")
    default = _bumped(by_pool.get(CPU_POOL, BUILDER_IMAGE), overrides)
    by_pool = {pool: _bumped(tc, overrides) for pool, tc in by_pool.items()}
    for pool in never:
        by_pool[pool] = _bumped(BUILDER_IMAGE, overrides)
    plan = plan_recipe(loaded, settings, PoolToolchains(default, by_pool))
    source = "Ray pools: " + "; ".join(sources + [f"{p} builder image" for p in never])
    result = Preview(plan, notes=notes, toolchain_source=source)
    if not any(n.startswith("cannot read") for n in notes):
        try:
            result.built = built_keys(registry_url, set(plan.stages))
        except RegistryError as exc:
            notes.append(f"cannot read the registry ({exc}); nothing is shown as built")
    return result

