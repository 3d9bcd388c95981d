"""build: a recipe's stage chain, run for real on this machine (the `enginectl build` verb).

Keys are computed with this machine's toolchain (probed), so what a builder publishes is
keyed by what it was really built with. The probe is recorded (pool `host:<name>`), which is
what `enginectl plan` keys with afterwards.

A build with nothing to do (every stage run done, the probe the one last recorded) is
answered from one read of the registry through its database driver (`pipeline.noop`): the
ORM, Alembic and the executors are imported only when there is work, or a dry run finds a
registry to migrate.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import BuildCancelledError
from pipeline.executors.outcome import BuildSummary, Outcome
from pipeline.keys import short_key
from pipeline.plan import Plan, StageRun, plan_recipe, selected_keys
from pipeline.recipe import LoadedRecipe, load_recipe
from pipeline.report import plan_lines
from pipeline.settings import Settings
from pipeline.toolchain import Probe, Toolchain, for_build, local_pool, probe
from registry.context import Context
from registry.errors import RegistryError, UsageError

if TYPE_CHECKING:
    from pipeline.executors.dag import Backend
    from pipeline.promote import Promotion
    from registry.records import ArtifactRecord

Echo = Callable[[str], None]


@dataclass
class BuildResult:
    plan: Plan
    hits: set[str]
    summary: BuildSummary = field(default_factory=BuildSummary)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What each pool's toolchain probe found (pool -> fingerprint), recorded or not."""
    promotions: list[Promotion] = field(default_factory=list)
    """The recipe's `promote` aliases this build moved (`pipeline.promote.promote_built`)."""


def _describe(outcome: Outcome) -> str:
    mark = {"built": "built  ", "reused": "reused ", "failed": "FAILED ", "skipped": "skipped",
            "pending-smoke": "smoke? ", "waiting": "waiting",
            "smoke-failed": "SMOKE! ", "cancelled": "stopped"}[outcome.status]
    where = outcome.targets[0] + (f" (+{len(outcome.targets) - 1})" if len(outcome.targets) > 1
                                  else "")
    timing = f" {outcome.seconds:.1f}s" if outcome.status == "built" else ""
    return f"{mark} {outcome.stage:<8} {short_key(outcome.key)}  {where}{timing}"


def build_recipe(
    recipe: Path,
    *,
    jobs: int = 2,
    only: str | None = None,
    force: bool = False,
    keep_going: bool = False,
    dry_run: bool = False,
    keep_work: bool = False,
    echo: Echo | None = None,
    live: bool | None = None,
    ctx: Context | None = None,
    run_on: str = "local",
    address: str = "auto",
    loaded: LoadedRecipe | None = None,
    promote: bool = True,
    record_probes: bool | None = None,
) -> BuildResult:
    """Build what *recipe* needs that the registry lacks (see the module doc).

    *echo* gets one line per finished stage run; *live* (default: stdout is a terminal) shows
    a live table instead. Published outputs leave the work directory once no later run
    reads them, unless *keep_work*. Ctrl-C raises `BuildCancelledError` with what was kept
    (its `summary` says which runs finished and which were cancelled). *run_on* "ray"
    runs the stage runs on the Ray cluster at *address* instead (`pipeline.fleet`).
    *loaded* is the recipe already read (a recorded one: *recipe* is where it was read);
    with *promote*, the recipe's `promote` aliases that point nowhere or at a superseded
    artifact move to the targets' ready artifacts (`pipeline.promote.promote_built`).
    *record_probes* says whether the toolchain probes are recorded (None: unless a local
    dry run; a Ray dry run records what it probed)."""
    if run_on == "ray":  # a Ray cluster's pools (pipeline.fleet); Ray is imported only there
        from pipeline.fleet import build_on_ray

        built: BuildResult = build_on_ray(recipe, address=address, only=only, force=force,
                                          keep_going=keep_going, dry_run=dry_run, echo=echo,
                                          ctx=ctx, loaded=loaded, promote=promote,
                                          record_probes=record_probes is not False)
        return built
    loaded = loaded or load_recipe(recipe)
    settings = Settings.from_env()
    found = probe(settings.python, os.environ.get("ENGINECTL_IMAGE_DIGEST"))
    plan = plan_recipe(loaded, settings, for_build(found.toolchain, loaded.recipe.toolchain))
    keys = selected_keys(plan, only)
    if not keys:
        raise UsageError(f"--only {only!r} matches no target of {recipe}")
    ctx = ctx or Context()
    try:
        if not force:
            done = _nothing_to_do(plan, keys, ctx, settings, found.toolchain, dry_run=dry_run,
                                  promote=promote, record_probes=record_probes)
            if done is not None:
                ctx.begin(store=False)  # nothing is read from the store, nor written
                if echo is not None and not dry_run:
                    for outcome in done.summary.outcomes:
                        echo(_describe(outcome))
                return done
        return _build(plan, keys, ctx, settings, found, recipe=recipe, jobs=jobs, force=force,
                      keep_going=keep_going, dry_run=dry_run, keep_work=keep_work, echo=echo,
                      live=live, promote=promote, record_probes=record_probes)
    finally:
        ctx.close()


def _nothing_to_do(plan: Plan, keys: set[str], ctx: Context, settings: Settings,
                   toolchain: Toolchain, *, dry_run: bool, promote: bool,
                   record_probes: bool | None) -> BuildResult | None:
    """The result of a build (or a dry run) with nothing to do, read without the ORM
    (`pipeline.noop`); None when there is work (a promotion or a probe to record is work),
    or the registry is not at the schema head."""
    from pipeline.noop import noop_summary
    from registry.lookup import build_state

    url = ctx.config.registry_url
    probes = {local_pool(): toolchain.as_dict()}
    if dry_run:  # what is built: the keys with an artifact, as `lookup` finds them
        if record_probes:
            return None
        try:
            state = build_state(url, keys, recipe=plan.loaded.digest, pool=local_pool())
        except RegistryError:
            return None
        return BuildResult(plan, set(state.artifacts), probes=probes) if state.current \
            else None
    summary = noop_summary(plan, keys, settings=settings, toolchain=toolchain,
                           registry_url=url, pool=local_pool(), host=socket.gethostname(),
                           channels=plan.channels if promote else ())
    if summary is None:
        return None
    hits = {o.key for o in summary.outcomes if o.status == "reused" and o.stage != "smoke"}
    return BuildResult(plan, hits, summary, probes=probes)


def _build(plan: Plan, keys: set[str], ctx: Context, settings: Settings, found: Probe, *,
           recipe: Path, jobs: int, force: bool, keep_going: bool, dry_run: bool,
           keep_work: bool, echo: Echo | None, live: bool | None, promote: bool,
           record_probes: bool | None) -> BuildResult:
    """The full path: look up the keys, record the recipe and the probe, walk the DAG, fill
    the recipe's empty promotion channels."""
    from pipeline.executors.local import LocalExecutor
    from pipeline.executors.stage import lookup
    from pipeline.promote import promote_built
    from registry import records

    loaded = plan.loaded
    hit_records = {} if force else lookup(ctx, keys)
    ctx.begin(registry=True)
    result = BuildResult(plan, set(hit_records), probes={local_pool(): found.toolchain.as_dict()})
    if record_probes or (record_probes is None and not dry_run):
        with ctx.registry.session() as session:
            # what `plan` keys with next time, and what a nightly compares with
            records.record_toolchain(session, local_pool(), found.toolchain.gpu,
                                     found.toolchain.as_dict(), socket.gethostname())
    if dry_run:
        return result
    with ctx.registry.session() as session:
        records.record_recipe(session, loaded.digest, loaded.recipe.display_name, loaded.text)
        records.touch_recipe(session, loaded.digest, loaded.path)
    with LocalExecutor(plan, ctx, settings, jobs=jobs, force=force,
                       local_gpu=found.toolchain.gpu, keep_work=keep_work) as executor:
        result.summary = shown_walk(plan, ctx, keys, executor, hits=hit_records,
                                    keep_going=keep_going, echo=echo, live=live)
    raise_if_interrupted(recipe, result.summary)
    if promote:
        result.promotions = promote_built(ctx, plan, result.summary)
    return result


def shown_walk(plan: Plan, ctx: Context, keys: set[str], backend: Backend, *,
               hits: Mapping[str, ArtifactRecord], keep_going: bool, echo: Echo | None,
               live: bool | None, view: type[LiveView] | None = None,
               describe: Callable[[Outcome], str] | None = None) -> BuildSummary:
    """The walk (`pipeline.executors.dag.walk`) shown as it goes: a live *view* table (default
    `LiveView`) when *live* (default: stdout is a terminal), else a *describe* line (default
    `_describe`) per finished run to *echo*; silent without *echo*."""
    from pipeline.executors.dag import walk

    if echo is not None and (sys.stdout.isatty() if live is None else live):
        with (view or LiveView)(plan, keys) as table:
            return walk(plan, ctx, keys, backend, hits=hits, keep_going=keep_going,
                        report=table.finished, started=table.started)
    line = describe or _describe
    report = (lambda outcome: echo(line(outcome))) if echo else None
    return walk(plan, ctx, keys, backend, hits=hits, keep_going=keep_going, report=report)


def raise_if_interrupted(recipe: Path, summary: BuildSummary) -> None:
    """Ctrl-C stopped the walk: `BuildCancelledError` with what was kept and cancelled."""
    if summary.interrupted:
        stopped = [f"{o.stage} {short_key(o.key)} ({o.targets[0]})"
                   for o in summary.outcomes if o.status == "cancelled"]
        raise BuildCancelledError(recipe, len(summary.kept), stopped, summary=summary)


class LiveView:
    """A live table of the stage runs on a terminal: waiting, running (with time), done."""

    def __init__(self, plan: Plan, keys: set[str]) -> None:
        from rich.live import Live

        self.plan = plan
        self.keys = [key for key in plan.stages if key in keys]
        self.state: dict[str, str] = dict.fromkeys(self.keys, "waiting")
        self.began: dict[str, float] = {}
        self.lock = threading.Lock()
        self.live = Live(self._table(), refresh_per_second=4, transient=False)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("stage", "key", "target", "state"):
            table.add_column(column)
        now = time.monotonic()
        for key in self.keys:
            run = self.plan.stages[key]
            state = self.state[key]
            if state == "running":
                state = f"[yellow]running {now - self.began[key]:.0f}s[/yellow]"
            elif state.startswith("built"):
                state = f"[green]{state}[/green]"
            elif state.startswith(("FAILED", "skipped")):
                state = f"[red]{state}[/red]"
            more = f" (+{len(run.targets) - 1})" if len(run.targets) > 1 else ""
            table.add_row(run.stage, short_key(key), run.targets[0] + more, state)
        return table

    def started(self, run: StageRun) -> None:
        with self.lock:
            self.state[run.key] = "running"
            self.began[run.key] = time.monotonic()
            self.live.update(self._table())

    def finished(self, outcome: Outcome) -> None:
        with self.lock:
            label = {"built": f"built {outcome.seconds:.1f}s", "failed": "FAILED",
                     "pending-smoke": "awaits smoke"}.get(outcome.status, outcome.status)
            self.state[outcome.key] = label
            self.live.update(self._table())

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)


def dry_run_lines(result: BuildResult) -> list[str]:
    return plan_lines(result.plan, built=frozenset(result.hits))


def summary_lines(result: BuildResult) -> list[str]:
    summary = result.summary
    lines = [
        "",
        (f"built {summary.count('built')}, reused {summary.count('reused')}, "
         f"failed {summary.count('failed')}, skipped {summary.count('skipped')}; "
         f"reuse saved {sum(o.saved_seconds for o in summary.outcomes):.1f}s of stage time"),
    ]
    for outcome in summary.outcomes:
        if outcome.status == "built":
            lines.append(f"  {outcome.stage:<8} {short_key(outcome.key)} {outcome.seconds:7.1f}s"
                         f"  {outcome.digest}")
    awaiting = [o for o in summary.outcomes if o.status == "pending-smoke"]
    if awaiting:
        lines.append(f"{len(awaiting)} artifacts await a smoke run (they stay 'built' until one "
                     "passes):")
        lines += [f"  {o.targets[0]}: {o.error}" for o in awaiting]
    for outcome in summary.failed:
        lines.append(f"FAILED {outcome.stage} {short_key(outcome.key)}: {outcome.error}")
    for outcome in summary.outcomes:
        if outcome.status == "smoke-failed":
            lines.append(f"SMOKE FAILED {outcome.targets[0]}: {outcome.error}")
    for promotion in result.promotions:
        lines.append(f"promoted {promotion.alias} -> {promotion.new} ({promotion.reason})")
    return lines
