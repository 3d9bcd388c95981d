"""preview: what `enginectl plan` shows — the plan keyed as the builds that run it would key
it, and which of its stages the registry already has.

A build keys every stage with the toolchain it probes on the pool that runs it; `plan` runs
nothing, so each target is keyed with the fingerprint last recorded (`toolchains`, which
`build` writes) for **the pool that runs that target's GPU stages**, never simply with this
machine's: a laptop's `plan` then says what the GPU builder will build, and a local build on
the laptop (its CPU stages, its own probe) leaves that answer alone. The pool of a target on
GPU SKU S:

    --pool NAME          the named pool, when its probe has S (repeatable)
    --executor local     this machine's host pool if it has run S, else the host pool that
                         ran S most recently, else the Ray pool S
    --executor ray       the Ray pool S (every group of nodes its last probing found: a pool
                         mid driver upgrade is planned once per group), else a host pool

Targets on no GPU (and the snapshot) are keyed with this machine's last probe (the Ray CPU
pool's with `--executor ray`). A target whose pool was never probed is keyed with the builder
image's versions, with a note. `--toolchain FIELD=VALUE` overrides a field everywhere. The
registry is read with its database driver alone (`registry.sql.lookup`), never created or
migrated, and a registry that cannot be read costs the "built" column, with a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pipeline.executors.groups import Group, group_lines, groups_of, plan_groups, pool_toolchain
from pipeline.executors.pools import CPU_POOL
from pipeline.planning.keys import short_key
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.planning.probe import local_pool
from pipeline.planning.toolchain import BUILDER_IMAGE, FIELDS, Toolchain, for_plan, from_dict
from pipeline.recipe.reader import LoadedRecipe
from pipeline.recipe.schema import ToolchainPins
from pipeline.settings import Settings
from pipeline.stages.refit import PLAN_FRACTION
from registry.config import masked_url
from registry.errors import RegistryError, UsageError
from registry.sql.lookup import Probed, built_keys, recorded_pools


@dataclass
class Preview:
    plan: Plan
    built: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    toolchain_source: str = "builder image"
    """Where each pool's toolchain came from, in words: "<gpu>: <pool> probed <time>; …"."""
    sources: list[dict[str, Any]] = field(default_factory=list)
    """The same per GPU SKU ("CPU": targets on no GPU): pool, host, probed_at (None: the
    builder image's versions), and the groups of a split Ray pool with their keys."""


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


def pool_of(recorded: Sequence[Probed], sku: str, *, ray: bool, here: str,
            named: Sequence[str] = ()) -> list[Probed]:
    """The recorded probing that keys the targets on GPU *sku* (*recorded*: newest first, as
    `registry.sql.lookup.recorded_pools` returns it): a Ray pool's every node, or one host
    pool's newest probe of *sku*; [] when no pool that has run *sku* was probed."""
    with_gpu = [p for p in recorded if p.gpu == sku]
    for pool in named:
        rows = [p for p in with_gpu if p.pool == pool]
        if rows:
            return rows if not pool.startswith("host:") else rows[:1]
    on_ray = [p for p in with_gpu if p.pool == sku]
    hosts = [p for p in with_gpu if p.pool.startswith("host:")]
    mine = [p for p in hosts if p.pool == here]
    for rows, single in ((on_ray, False), (hosts, True)) if ray else \
            ((mine, True), (hosts, True), (on_ray, False)):
        if rows:
            return rows[:1] if single else rows
    return []


def preview(loaded: LoadedRecipe, settings: Settings, *, registry_url: str,
            pools: str = "local", overrides: Mapping[str, str] | None = None,
            named: Sequence[str] = ()) -> Preview:
    """The plan of *loaded* keyed for the pools that would run it (the module doc says which:
    *pools* "local" or "ray", *named* pools first); *overrides* replace fields of every
    pool's fingerprint (what-if: `plan --toolchain driver=…`). UsageError when a *named*
    pool has no recorded probe."""
    readable = True
    cannot_read = None
    try:
        recorded = recorded_pools(registry_url)
    except RegistryError as exc:
        recorded, readable = [], False
        cannot_read = (f"cannot read the registry ({exc}); keys use the builder image's "
                       "versions and nothing is shown as built")
    _check_named(recorded, named, registry_url, readable=readable)
    draft = plan_recipe(loaded, settings)
    skus = sorted({t.target.gpu.sku for t in draft.targets if not t.target.gpu.is_cpu})
    keying = _Keying(recorded, pools == "ray", tuple(named), loaded.recipe.toolchain,
                     overrides or {})
    if cannot_read:
        keying.notes.append(cannot_read)
    keyed = {sku: keying.gpu(sku) for sku in skus}
    default = keying.default(any(t.target.gpu.is_cpu for t in draft.targets))
    for pool in named:
        if not any(p.pool == pool and p.gpu in {*skus, "CPU"} for p in recorded):
            keying.notes.append(f"--pool {pool}: it has run none of this recipe's GPUs "
                                f"({', '.join(skus) or 'none'}); it keys nothing here")
    grouped = plan_groups(loaded, settings, default, keyed)
    for source in keying.sources:
        for number, group in enumerate(source.get("groups", ())):
            group["keys"] = sorted(set(grouped.group_keys.get((source["gpu"], number), [])))
    if keying.never and readable:
        keying.notes.append(f"no toolchain is recorded for {keying.never_said()} in "
                            f"{masked_url(registry_url)}; their targets are keyed with the builder "
                            "image's versions (`enginectl build` there records them; "
                            "--toolchain FIELD=VALUE names versions)")
    result = Preview(grouped.plan, notes=keying.notes, sources=keying.sources,
                     toolchain_source="; ".join(_said(s) for s in keying.sources)
                     or "builder image")
    if readable:
        try:
            result.built = built_keys(registry_url, set(grouped.plan.stages))
        except RegistryError as exc:
            result.notes.append(f"cannot read the registry ({exc}); nothing is shown as built")
    return result


def _check_named(recorded: Sequence[Probed], named: Sequence[str], url: str, *,
                 readable: bool) -> None:
    known = sorted({p.pool for p in recorded})
    for pool in named:
        if readable and pool not in known:
            raise UsageError(f"--pool {pool!r}: no probe of it is recorded in {masked_url(url)}; "
                             f"recorded pools: {', '.join(known) or 'none'} (a build there "
                             "records one)")


@dataclass
class _Keying:
    """Which recorded probe keys which targets, and what `plan` says about it."""

    recorded: Sequence[Probed]
    ray: bool
    named: tuple[str, ...]
    pins: ToolchainPins
    overrides: Mapping[str, str]
    notes: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    never: list[str] = field(default_factory=list)  # SKUs, or "<pool> (…)", never probed

    def gpu(self, sku: str) -> list[tuple[Group, Toolchain]]:
        """The groups that key the targets on *sku*, each with its toolchain (one, unless a
        split Ray pool keys them)."""
        rows = pool_of(self.recorded, sku, ray=self.ray, here=local_pool(), named=self.named)
        if not rows:
            self.never.append(sku)
            self.sources.append(_source(sku, None))
            return [(Group(sku, BUILDER_IMAGE, (), ()), _bumped(BUILDER_IMAGE, self.overrides))]
        pool = rows[0].pool
        if pool not in self.named and self.ray == pool.startswith("host:"):  # other kind
            self.notes.append(
                f"no {'Ray pool' if self.ray else 'host'} has recorded a probe of {sku}; its "
                f"targets are keyed with {'host ' if self.ray else 'the Ray pool '}{pool}'s, "
                f"probed {rows[0].probed_at}")
        groups = groups_of(sku, [(from_dict(p.fingerprint), p.node_id or p.pool, p.host)
                                 for p in rows])
        if not self.ray:  # a local build has one fingerprint: the largest group's
            groups = groups[:1]
        keyed = []
        for group in groups:
            toolchain, why = for_plan(group.toolchain, self.pins)
            keyed.append((group, _bumped(toolchain, self.overrides)))
            if why:
                self.notes.append(f"pool {pool}: {why}")
        self.sources.append(_source(sku, rows[0], groups if len(groups) > 1 else []))
        if len(groups) > 1:
            self.notes.append(f"pool {sku} is split ({'; '.join(group_lines(groups))}): each "
                              "of its targets is planned once per group, as a build there "
                              "runs it")
        return keyed

    def default(self, cpu_targets: bool) -> Toolchain:
        """What targets on no GPU (and the snapshot) are keyed with: a named pool's probe
        with no GPU, else this machine's last probe (the Ray CPU pool's with `ray`)."""
        here = CPU_POOL if self.ray else local_pool()
        candidates = [p for pool in self.named for p in self.recorded
                      if p.pool == pool and p.gpu == "CPU"]
        candidates += [p for p in self.recorded if p.pool == here]
        if not candidates:
            if cpu_targets:
                self.never.append(f"{here} (the targets on no GPU)")
                self.sources.append(_source("CPU", None))
            return _bumped(BUILDER_IMAGE, self.overrides)
        probed = candidates[0]
        found = from_dict(probed.fingerprint)
        toolchain, why = for_plan(pool_toolchain(CPU_POOL, found) if self.ray else found,
                                  self.pins)
        if cpu_targets:
            self.sources.append(_source("CPU", probed))
            if why:
                self.notes.append(f"pool {probed.pool}: {why}")
        return _bumped(toolchain, self.overrides)

    def never_said(self) -> str:
        gpus = [name for name in self.never if " " not in name]
        what = ([f"{'a pool' if len(gpus) == 1 else 'pools'} with {', '.join(gpus)}"]
                if gpus else []) + [name for name in self.never if " " in name]
        return " and ".join(what)


def _source(gpu: str, probed: Probed | None, groups: Sequence[Group] = ()) -> dict[str, Any]:
    if probed is None:
        return {"gpu": gpu, "pool": None, "host": None, "probed_at": None}
    found: dict[str, Any] = {"gpu": gpu, "pool": probed.pool, "host": probed.host,
                             "probed_at": probed.probed_at}
    if groups:
        found["groups"] = [{**g.as_dict(), "line": line}
                           for g, line in zip(groups, group_lines(groups), strict=True)]
    return found


def _said(source: Mapping[str, Any]) -> str:
    if source["pool"] is None:
        return f"{source['gpu']}: builder image"
    return f"{source['gpu']}: {source['pool']} probed {source['probed_at']}"


def group_plan_lines(result: Preview) -> list[str]:
    """For `plan`'s text: each split pool's groups, and the build and smoke keys of each."""
    lines: list[str] = []
    for source in result.sources:
        groups = source.get("groups") or []
        if not groups:
            continue
        lines += ["", f"pool {source['gpu']} is split into {len(groups)} groups:"]
        for number, group in enumerate(groups, 1):
            runs = [result.plan.stages[key] for key in group.get("keys", ())
                    if key in result.plan.stages]
            shown_keys = ", ".join(f"{run.stage} {short_key(run.key)}" for run in runs
                                   if run.stage in ("build", "smoke") and run.gpu != CPU_POOL)
            lines.append(f"  group {number}: {group['line']}: {shown_keys or 'nothing'}")
    return lines


def store_bytes(plan: Plan) -> dict[str, Any]:
    """What the recipe's engine matrix keeps in the store, whole and weight-stripped
    (estimated, for `plan`): each engine about its weights (the memory fit's per rank, times
    its ranks), each checkpoint it is built from the same, once however many engines share
    it (stored either way: a stripped engine's refit source), and a stripped plan
    `PLAN_FRACTION` of its whole engine (NVIDIA's published sample)."""
    engines = checkpoints = 0
    sources: set[str] = set()
    fits = {t.target.id: t.fit.weights_bytes * t.target.tp * t.target.pp for t in plan.targets}
    for run in plan.stages.values():
        if run.kind != "trtllm-engine":
            continue
        weights = fits[run.targets[0]]
        engines += weights
        if run.inputs[0] not in sources:
            sources.add(run.inputs[0])
            checkpoints += weights
    plans = round(engines * PLAN_FRACTION)
    return {"model": plan.loaded.recipe.model.name,
            "strip_plan": plan.loaded.recipe.build.strip_plan, "engines": len(
                [r for r in plan.stages.values() if r.kind == "trtllm-engine"]),
            "checkpoint_bytes": checkpoints, "whole_bytes": checkpoints + engines,
            "stripped_bytes": checkpoints + plans, "plan_bytes": plans}


def store_bytes_line(found: Mapping[str, Any]) -> str:
    """`plan`'s line for `store_bytes`."""
    whole, stripped = found["whole_bytes"], found["stripped_bytes"]
    engines = whole - found["checkpoint_bytes"]
    chosen = "strip_plan: true" if found["strip_plan"] else "strip_plan: false, the default"
    return (f"store, {found['model']} ({found['engines']} engines; {chosen}): engines "
            f"{_gib(engines)} whole, {_gib(found['plan_bytes'])} weight-stripped; with their "
            f"checkpoints (stored either way) {_gib(whole)} → {_gib(stripped)} "
            f"(÷{whole / max(stripped, 1):.1f}); estimated from the weights, a stripped plan "
            f"~{PLAN_FRACTION:.2%} of its engine")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
