"""build: a recipe's stage chain, run for real on this machine (the `enginectl build` verb).

Keys are computed with this machine's toolchain (probed), so what a builder publishes is
keyed by what it was really built with. The probe is recorded (pool `host:<name>`), which is
what `enginectl plan` keys with afterwards.

A build with nothing to do (every stage run done, the probe the one last recorded) is
answered from one read of the registry through its database driver
(`pipeline.executors.noop`): the ORM, Alembic and the executors are imported only when there
is work, or a dry run finds a registry to migrate. A build on a Ray cluster is
`pipeline.executors.ray_build`'s. A build that reads the recipe itself (not a dry run)
remembers its plan for the no-op builds after it (`pipeline.planning.plan_cache`,
`pipeline.executors.noop.remembered_noop`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from pipeline.executors.result import BuildOptions, BuildResult, Planned, raise_if_interrupted
from pipeline.executors.view import describe, walk_and_report
from pipeline.planning.plan import Plan, plan_recipe, selected_keys
from pipeline.planning.plan_cache import cache_dir, facts_of, remember_plan
from pipeline.planning.probe import Probe, local_pool, probe
from pipeline.planning.source import read_recipe
from pipeline.planning.toolchain import Toolchain, for_build
from pipeline.recipe.reader import LoadedRecipe
from pipeline.settings import Settings
from registry.context import Context
from registry.errors import RegistryError, UsageError


def build_recipe(
    recipe: Path,
    *,
    ctx: Context,
    settings: Settings,
    options: BuildOptions | None = None,
    loaded: LoadedRecipe | None = None,
    planned: Planned | None = None,
    probed: Probe | None = None,
) -> BuildResult:
    """Build what *recipe* needs that the registry lacks (see the module doc), in the
    registry of *ctx* (which its caller made and closes) with *settings*, as *options* say
    (None: `BuildOptions()`).

    `options.echo` gets one line per finished stage run; `options.live` (default: stdout is
    a terminal) shows a live table instead. Published outputs leave the work directory once
    no later run reads them, unless `options.keep_work`. Ctrl-C raises `BuildCancelledError`
    with what was kept (its `summary` says which runs finished and which were cancelled).
    `options.run_on` "ray" runs the stage runs on the Ray cluster at `options.address`
    instead (`pipeline.executors.ray_build`). *loaded* is the recipe already read (a
    recorded one: *recipe* is where it was read); with `options.promote`, the recipe's
    `promote` aliases that point nowhere or at a superseded artifact move to the targets'
    ready artifacts (`pipeline.serving.promote.promote_built`). `options.record_probes`
    says whether the toolchain probes are recorded (None: unless a local dry run; a Ray dry
    run records what it probed). *planned* is what an earlier build of the same recipe (a
    dry run) probed and planned (`BuildResult.planned`): nothing is probed or planned
    again. *probed* is this machine's probe, taken a moment ago by the same process (the
    first try at a no-op, `pipeline.executors.noop.remembered_noop`): not taken again."""
    options = options or BuildOptions()
    if options.run_on == "ray":  # a Ray cluster's pools; Ray is imported only there
        from pipeline.executors.ray_build import build_on_ray

        built: BuildResult = build_on_ray(recipe, ctx=ctx, settings=settings, options=options,
                                          loaded=loaded, planned=planned)
        return built
    if planned is None or planned.probe is None:
        # a build that reads the recipe itself remembers its plan, and vLLM's probe, for the
        # builds after it (`pipeline.planning.plan_cache`); a dry run writes nothing
        remember = loaded is None and not options.dry_run
        probing = _Probing(settings, remember=cache_dir(settings) if remember else None,
                           taken=probed)
        started, raw = time.time(), None
        try:
            if remember:
                with contextlib.suppress(OSError):  # read_recipe says what is wrong
                    raw = recipe.read_bytes()
            loaded = loaded or read_recipe(recipe)
        except BaseException:
            probing.join()  # no probe left running; the recipe's error is the one said
            raise
        found = probing.result()
        plan = plan_recipe(loaded, settings, for_build(found.toolchain, loaded.recipe.toolchain))
        if raw is not None:
            remember_plan(recipe, raw, plan, settings, found.toolchain, started=started)
    else:
        found, plan = planned.probe, planned.plan
    keys = selected_keys(plan, options.only)
    if not keys:
        raise UsageError(f"--only {options.only!r} matches no target of {recipe}")
    result = None if options.force else _nothing_to_do(plan, keys, ctx, settings,
                                                       found.toolchain, options=options)
    if result is not None:
        ctx.begin(store=False)  # nothing is read from the store, nor written
        if options.echo is not None and not options.dry_run:
            for outcome in result.summary.outcomes:
                options.echo(describe(outcome))
    else:
        result = _build(plan, keys, ctx, settings, found, recipe=recipe, options=options)
    result.planned = Planned(plan, probe=found)
    return result


class _Probing:
    """This machine's probe (`probe`), asked in a thread of its own from the start: most of
    it is waiting on other programs, which overlaps with reading the recipe. *taken*: the
    probe this process took a moment ago, the answer without asking again."""

    def __init__(self, settings: Settings, *, remember: Path | None,
                 taken: Probe | None = None) -> None:
        self._answer: list[Probe | BaseException] = [] if taken is None else [taken]
        self._thread = None if taken is not None else threading.Thread(
            target=self._ask, args=(settings, remember), name="probe", daemon=True)
        if self._thread is not None:
            self._thread.start()

    def _ask(self, settings: Settings, remember: Path | None) -> None:
        try:
            self._answer.append(probe(settings, remember=remember))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self._answer.append(exc)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def result(self) -> Probe:
        self.join()
        answer = self._answer[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _nothing_to_do(plan: Plan, keys: set[str], ctx: Context, settings: Settings,
                   toolchain: Toolchain, *, options: BuildOptions) -> BuildResult | None:
    """The result of a build (or a dry run) with nothing to do, read without the ORM
    (`pipeline.executors.noop`); None when there is work (a promotion or a probe to record is work),
    or the registry is not at the schema head."""
    from pipeline.executors.noop import noop_summary
    from registry.sql.lookup import build_state

    url = ctx.config.registry_url
    probes = {local_pool(): toolchain.as_dict()}
    if options.dry_run:  # what is built: the keys with an artifact, as `lookup` finds them
        if options.record_probes:
            return None
        try:
            state = build_state(url, keys, recipe=plan.loaded.digest, pool=local_pool())
        except RegistryError:
            return None
        return BuildResult(plan, set(state.artifacts), probes=probes) if state.current \
            else None
    summary = noop_summary(facts_of(plan), keys, settings=settings, toolchain=toolchain,
                           registry_url=url, pool=local_pool(), host=socket.gethostname(),
                           channels=plan.channels if options.promote else ())
    if summary is None:
        return None
    hits = {o.key for o in summary.outcomes if o.status == "reused" and o.stage != "smoke"}
    return BuildResult(plan, hits, summary, probes=probes)


def _build(plan: Plan, keys: set[str], ctx: Context, settings: Settings, found: Probe, *,
           recipe: Path, options: BuildOptions) -> BuildResult:
    """The full path: look up the keys, record the recipe and the probe, walk the DAG, fill
    the recipe's empty promotion channels."""
    from pipeline.executors.local import LocalExecutor
    from pipeline.executors.stage import lookup
    from pipeline.serving.promote import promote_built
    from registry.sql import build_inputs

    loaded = plan.loaded
    hit_records = {} if options.force else lookup(ctx, keys)
    ctx.begin(registry=True)
    result = BuildResult(plan, set(hit_records), probes={local_pool(): found.toolchain.as_dict()})
    if options.record_probes or (options.record_probes is None and not options.dry_run):
        with ctx.registry.session() as session:
            # what `plan` keys with next time, and what a nightly compares with
            build_inputs.record_toolchain(session, local_pool(), found.toolchain.gpu,
                                          found.toolchain.as_dict(), socket.gethostname())
    if options.dry_run:
        return result
    with ctx.registry.session() as session:
        build_inputs.record_recipe(session, loaded.digest, loaded.recipe.display_name, loaded.text)
        build_inputs.touch_recipe(session, loaded.digest, loaded.path)
    with LocalExecutor(plan, ctx, settings, jobs=options.jobs, force=options.force,
                       local_gpu=found.toolchain.gpu, gpu_count=found.gpu_count,
                       keep_work=options.keep_work) as executor:
        result.summary = walk_and_report(plan, ctx, keys, executor, hits=hit_records,
                                         keep_going=options.keep_going, echo=options.echo,
                                         live=options.live)
    raise_if_interrupted(recipe, result.summary)
    if options.promote:
        result.promotions = promote_built(ctx, plan, result.summary)
    return result
