"""noop: a build of a recipe whose every stage run is already done, read without the ORM.

Such a build does no work, so what it costs is start-up and one look at the registry;
SQLAlchemy's ORM and Alembic alone would cost more than that (as for `fetch`,
`registry.sql.lookup`). `noop_summary` reads what the walk (`pipeline.executors.dag`) would ask,
in one connection of the database driver (`registry.sql.lookup.build_state`), and answers the
outcomes the walk would report:

  a stage run with an artifact  reused, with the time its original run took
  a smoke run                   reused when it passed on an entry that is ready; pending-smoke
                                with the same reason when this machine cannot run it and the
                                entry already says so

or None, and the build takes the full path (ORM, leases, executor) that writes what is
needed, when anything would be written or run: a key without an artifact, a smoke run this
machine can run (or whose entry's status reason is not yet the one it would set), a recipe
text not yet stored or not the one of its name last built from this path (what a nightly
takes), a promotion channel the build would fill (`pipeline.serving.promote.promote_built`), a
toolchain probe other than the last one recorded for this machine's pool, or a registry not
at the schema head (one to migrate, or to refuse). An unchanged probe is not recorded again.
Reads only; pure apart from `build_state` and the smoke check of
`pipeline.serving.smoke_here.unavailable`.

`remembered_noop` is `enginectl build`'s first try: this machine's probe (taken every time,
by the caller, which hands it to the full path when this answers None), the plan a build
remembered (`pipeline.planning.plan_cache`, taken only while nothing it depends
on changed, that probe included) and `noop_summary`, without reading the recipe with
pydantic or planning; anything else takes `pipeline.executors.build.build_recipe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.planning.channels import Channel
from pipeline.planning.outcome import BuildSummary, Outcome, awaits_smoke, pending_smoke
from pipeline.planning.plan_cache import PlanFacts
from pipeline.planning.toolchain import Toolchain
from pipeline.settings import Settings
from registry.errors import RegistryError
from registry.sql.lookup import BuildState, build_state

if TYPE_CHECKING:
    from pipeline.planning.probe import Probe


def noop_summary(plan: PlanFacts, keys: set[str], *, settings: Settings, toolchain: Toolchain,
                 registry_url: str, pool: str, host: str,
                 channels: Sequence[Channel] = ()) -> BuildSummary | None:
    """The summary of building *keys* of *plan* (a plan's facts: `plan_cache.facts_of`) when
    every one is done (module doc), else None. *toolchain* is this machine's probe, to be
    recorded for *pool* on *host*; *channels* are the promotion channels the build would
    fill."""
    try:
        state = build_state(registry_url, keys, recipe=plan.digest, pool=pool,
                            name=plan.name, aliases={channel.alias for channel in channels})
    except RegistryError:  # the full path opens it, and says what is wrong
        return None
    probe = state.probe
    if not state.current or not state.recipe_stored \
            or state.latest_recipe != (plan.digest, plan.path) \
            or probe is None or probe.host != host or probe.fingerprint != toolchain.as_dict():
        return None
    summary = outcomes(plan, keys, state, settings=settings, local_gpu=toolchain.gpu)
    if summary is None or would_promote(summary, channels, state):
        return None
    return summary


def would_promote(summary: BuildSummary, channels: Sequence[Channel], state: BuildState) -> bool:
    """Whether the build rule (`pipeline.serving.promote.promote_built`) would move an alias: a
    channel's entry proven ready here while its alias points nowhere or at a superseded
    artifact."""
    proven = {o.key: o.digest for o in summary.outcomes
              if o.stage == "smoke" and o.status == "reused" and o.digest}
    for channel in channels:
        new = proven.get(channel.smoke)
        if new is None:
            continue
        current = state.aliases.get(channel.alias)
        if current is None or (current[0] != new and current[1] == "superseded"):
            return True
    return False


def outcomes(plan: PlanFacts, keys: set[str], state: BuildState, *, settings: Settings,
             local_gpu: str | None) -> BuildSummary | None:
    """What the walk reports for *keys* given *state*: every reuse in plan order, then the
    smoke runs (the walk settles hits at once and hears from smoke runs after); None when
    any run would do work."""
    from pipeline.serving.smoke_here import unavailable

    reused: list[Outcome] = []
    smoked: list[Outcome] = []
    for key, run in plan.stages.items():
        if key not in keys:
            continue
        if run.stage != "smoke":
            artifact = state.artifacts.get(key)
            if artifact is None:
                return None
            past = state.runs.get(key)
            saved = past.seconds if past is not None and past.seconds is not None else 0.0
            reused.append(Outcome(run.stage, key, "reused", run.targets,
                                  digest=artifact.digest, saved_seconds=saved))
            continue
        entry = state.artifacts.get(run.inputs[0])
        if entry is None:
            return None
        past = state.runs.get(key)
        if entry.status in ("ready", "superseded") and past is not None \
                and past.status == "succeeded":
            smoked.append(Outcome(run.stage, key, "reused", run.targets, digest=entry.digest))
            continue
        reason = unavailable(run, settings, local_gpu)
        if reason is None or (entry.status == "built" and entry.reason != awaits_smoke(reason)):
            return None  # a smoke to run, or a status reason to record
        smoked.append(pending_smoke(run.stage, key, run.targets, entry=entry.digest,
                                    gpu=run.gpu, reason=reason))
    return BuildSummary(reused + smoked)


def remembered_noop(recipe: Path, found: Probe, *, settings: Settings, registry_url: str,
                    only: str | None) -> tuple[PlanFacts, BuildSummary] | None:
    """A local build of *recipe* (the targets matching *only*) with nothing to do, answered
    from the plan a build remembered (`pipeline.planning.plan_cache`) and *found*, this
    machine's probe taken now (`pipeline.planning.probe.probe`, its Pythons' parts
    remembered per Python): the plan's facts and the summary, or None when the plan must be
    made from the recipe or there is work (`noop_summary`)."""
    import socket

    from pipeline.planning.plan_cache import remembered_plan
    from pipeline.planning.probe import local_pool

    plan = remembered_plan(recipe, settings, found.toolchain)
    if plan is None:
        return None
    keys = plan.keys(only)
    if not keys:  # the full path says that --only matches nothing
        return None
    summary = noop_summary(plan, keys, settings=settings, toolchain=found.toolchain,
                           registry_url=registry_url, pool=local_pool(),
                           host=socket.gethostname(), channels=plan.channels)
    return None if summary is None else (plan, summary)
