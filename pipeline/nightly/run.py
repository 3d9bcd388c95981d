"""nightly: notice every toolchain bump, rebuild and re-prove what it invalidates, and promote
only what is no worse (DESIGN §6, the `enginectl nightly` verb).

    lease     one nightly at a time: the nightly lease (`registry.leases`); a second one waits
              for the first and then finds nothing to do
    probe     each recipe's pools, as its build probes them (this machine for the local
              executor, each Ray pool for --executor ray), recorded; diffed with the probe of
              that pool recorded before this run
    re-plan   every recipe keyed with the new fingerprints: a key the registry lacks is what
              changed; each is explained by the fingerprint fields its key takes that differ
    build     the recipe's build (keep-going: one failing target never blocks the others),
              which reuses everything still keyed the same and re-smokes entries whose smoke
              key moved (a requalified entry keeps its digest; a rebuilt engine is new)
    promote   the gated rule of `pipeline.promote` for the channels whose target changed
    report    per pool what changed, per recipe and target what it invalidated, rebuilt,
              re-proved, promoted or held, with old and new throughput; recorded in
              `nightly_runs`

A run where nothing is missing changes nothing and says since when (the last nightly).
"""

from __future__ import annotations

import _thread
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.build import build_recipe
from pipeline.errors import BuildCancelledError
from pipeline.executors.local import owner_id
from pipeline.executors.outcome import BuildSummary, Outcome
from pipeline.executors.runner import CANCEL_GRACE_S, stop_all
from pipeline.nightly.diff import FieldChange, KeyChange, key_changes, toolchain_changes
from pipeline.plan import Plan, plan_recipe
from pipeline.promote import Level, Promotion, compare_levels, latest_passing, promote_gated
from pipeline.recipe import LoadedRecipe, load_recipe, parse_recipe
from pipeline.settings import Settings
from pipeline.toolchain import BUILDER_IMAGE, PoolToolchains, Toolchain, for_plan, from_dict
from registry import leases, nightly_runs, records
from registry.context import Context
from registry.errors import EnginectlError, RegistryError, UsageError
from registry.heartbeat import Heartbeat
from registry.lookup import built_keys
from registry.models import utcnow

Echo = Callable[[str], None]


@dataclass
class PoolReport:
    pool: str
    gpu: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_at: datetime | None
    changes: list[FieldChange] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "gpu": self.gpu, "before": self.before, "after": self.after,
                "before_probed_at": self.before_at.isoformat() if self.before_at else None,
                "changes": [c.as_dict() for c in self.changes]}


@dataclass
class StageReport:
    """One stage run of a target whose key the registry lacked."""

    stage: str
    key: str
    because: list[str]
    outcome: str  # the build's outcome status, or "would run" on a dry run
    digest: str | None = None
    error: str | None = None
    log: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "key": self.key, "because": self.because,
                "outcome": self.outcome, "digest": self.digest, "error": self.error,
                "log": self.log}


@dataclass
class TargetReport:
    id: str
    stages: list[StageReport] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    """Old and new smoke throughput and TTFT per concurrency level."""
    promotions: list[Promotion] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """rebuilt, re-proved, failed, would rebuild / re-prove (dry run)."""
        outcomes = {s.outcome for s in self.stages}
        if outcomes & {"failed", "smoke-failed", "cancelled", "skipped", "pending-smoke"}:
            return "failed"
        built = {s.stage for s in self.stages if s.outcome == "built"}
        if "would run" in outcomes:
            return "would rebuild" if any(s.stage != "smoke" for s in self.stages) \
                else "would re-prove"
        return "rebuilt" if built - {"smoke"} else "re-proved"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "verdict": self.verdict,
                "stages": [s.as_dict() for s in self.stages],
                "levels": [level.as_dict() for level in self.levels],
                "promotions": [p.as_dict() for p in self.promotions]}


@dataclass
class RecipeReport:
    name: str
    path: str
    digest: str
    targets: list[TargetReport] = field(default_factory=list)
    error: str | None = None  # the recipe could not be planned or built at all
    exit_code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "digest": self.digest,
                "error": self.error, "targets": [t.as_dict() for t in self.targets]}


@dataclass
class NightlyReport:
    started_at: datetime
    executor: str
    dry_run: bool
    finished_at: datetime | None = None
    pools: list[PoolReport] = field(default_factory=list)
    recipes: list[RecipeReport] = field(default_factory=list)
    since: datetime | None = None
    """When the last nightly ran (what "nothing changed since" refers to)."""
    waited_for: str | None = None
    """The nightly this one waited for (its owner), if another held the lease."""
    notify: dict[str, Any] | None = None

    @property
    def nothing_changed(self) -> bool:
        return not any(p.changes for p in self.pools) and not any(
            r.targets or r.error for r in self.recipes)

    @property
    def failures(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for recipe in self.recipes:
            if recipe.error:
                found.append({"recipe": recipe.name, "target": None, "stage": None,
                              "key": None, "error": recipe.error, "log": None})
            for target in recipe.targets:
                found += [{"recipe": recipe.name, "target": target.id, **s.as_dict()}
                          for s in target.stages if s.outcome in
                          ("failed", "smoke-failed", "cancelled", "pending-smoke")]
                found += [{"recipe": recipe.name, "target": target.id, "stage": "promote",
                           "key": None, "outcome": "held", "alias": p.alias,
                           "error": p.reason, "log": None}
                          for p in target.promotions if p.action == "held"]
        return found

    @property
    def exit_code(self) -> int:
        """3 when a stage failed (or could not run here), else 5 when a smoke failed or a
        regression held an alias, else 0."""
        codes = {r.exit_code for r in self.recipes if r.error}
        outcomes = {f.get("outcome") for f in self.failures}
        if codes - {5} or outcomes & {"failed", "cancelled", "pending-smoke"}:
            return 3
        if 5 in codes or outcomes & {"smoke-failed", "held"}:
            return 5
        return 0


def recipe_paths(arguments: Sequence[Path]) -> list[Path]:
    """RECIPE files as given, and every *.yaml / *.yml of a DIR, sorted."""
    found: list[Path] = []
    for path in arguments:
        if path.is_dir():
            found += sorted(p for p in path.iterdir()
                            if p.suffix in (".yaml", ".yml") and p.is_file())
        else:
            found.append(path)
    return found


def recorded(ctx: Context) -> list[LoadedRecipe | RecipeReport]:
    """Every recipe the registry has built, at its latest recorded content, read as if at
    the place it was read from (its local sources are relative to it); one that no longer
    reads (its local model moved away) is a failed recipe of the report, not of the run."""
    with ctx.registry.session(readonly=True) as session:
        rows = records.recorded_recipes(session)
    found: list[LoadedRecipe | RecipeReport] = []
    for row in rows:
        try:
            found.append(parse_recipe(Path(row.path), row.text))
        except EnginectlError as exc:
            found.append(RecipeReport(row.name, row.path, row.digest,
                                      error=f"cannot read the recorded recipe: {exc}",
                                      exit_code=exc.exit_code))
    return found


def _pools_of(plan: Plan, executor: str) -> list[str]:
    from pipeline.toolchain import local_pool

    if executor == "local":
        return [local_pool()]
    return sorted(plan.toolchains.by_gpu)


def _keyed_before(loaded: LoadedRecipe, settings: Settings, executor: str,
                  before: dict[str, records.ToolchainProbe]) -> Plan | None:
    """The plan as the probes recorded before this run key it (None: no probe to key with)."""
    pins = loaded.recipe.toolchain

    def recorded_toolchain(pool: str) -> Toolchain | None:
        probe = before.get(pool)
        return None if probe is None else for_plan(from_dict(probe.fingerprint), pins)[0]

    if executor == "local":
        from pipeline.toolchain import local_pool

        found = recorded_toolchain(local_pool())
        return None if found is None else plan_recipe(loaded, settings, found)
    from pipeline.executors.pools import CPU_POOL, pool_toolchain

    draft = plan_recipe(loaded, settings)
    by_pool: dict[str, Toolchain] = {}
    for sku in sorted({t.target.gpu.sku for t in draft.targets}):
        probe = before.get(sku)
        if probe is None:
            return None
        by_pool[sku] = for_plan(pool_toolchain(sku, from_dict(probe.fingerprint)), pins)[0]
    default = recorded_toolchain(CPU_POOL) or BUILDER_IMAGE
    return plan_recipe(loaded, settings, PoolToolchains(default, by_pool))


def _outcomes(summary: BuildSummary | None) -> dict[str, Outcome]:
    return {} if summary is None else {o.key: o for o in summary.outcomes}


class _LeaseKeeper:
    """Holds the nightly lease: waits for another nightly that holds it, keeps it with a
    heartbeat (`registry.heartbeat`) while this one runs, releases it at the end. When the
    lease is lost (taken over, or the registry out of reach until little of it was left)
    the nightly is stopped: its children at once, and its main thread as Ctrl-C would;
    `nightly` then fails with `lost_error()`."""

    def __init__(self, ctx: Context, settings: Settings, note: Echo) -> None:
        self.ctx, self.note = ctx, note
        self.owner = owner_id()
        self.ttl_s = settings.lease_ttl_s
        self.done = threading.Event()
        self.waited_for: str | None = None
        self.heartbeat: Heartbeat | None = None
        self.in_main = threading.current_thread() is threading.main_thread()

    @property
    def lost(self) -> str | None:
        return None if self.heartbeat is None else self.heartbeat.lost

    def lost_error(self) -> RegistryError:
        return RegistryError(f"{self.lost}; this nightly was stopped")

    def acquire(self, report: NightlyReport) -> _LeaseKeeper:
        """Take the nightly lease, waiting for another nightly that holds it (noted in
        *report*), and start its heartbeat."""
        poll = min(5.0, self.ttl_s / 4)
        while True:
            with self.ctx.registry.session() as session:
                got = leases.try_acquire_nightly(session, owner=self.owner,
                                                 host=socket.gethostname(), pid=os.getpid(),
                                                 ttl_s=self.ttl_s)
                holder = None if got else leases.nightly_holder(session)
            if got:
                break
            if holder is not None and self.waited_for != holder.owner:
                self.waited_for = holder.owner
                self.note(f"another nightly holds the run: {holder.owner} on {holder.host}, "
                          f"since {holder.started_at:%Y-%m-%d %H:%M:%S} UTC; waiting for it")
            if self.done.wait(poll):
                raise UsageError("stopped while waiting for another nightly")
        self.heartbeat = Heartbeat(self.ctx.registry, leases.NIGHTLY_KEY, owner=self.owner,
                                   ttl_s=self.ttl_s, on_lost=self._stop).start()
        report.waited_for = self.waited_for
        return self

    def _stop(self, reason: str) -> None:
        self.note(f"nightly: {reason}; stopping")
        stop_all(CANCEL_GRACE_S)
        if self.in_main:
            _thread.interrupt_main()  # the build winds down as on Ctrl-C

    def release(self, failed: bool) -> None:
        self.done.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
            if self.lost is not None:
                return  # not ours any more
            with self.ctx.registry.session() as session:
                leases.release_lease(session, leases.NIGHTLY_KEY, owner=self.owner,
                                     status="failed" if failed else "succeeded")


def nightly(arguments: Sequence[Path] = (), *, executor: str = "local", address: str = "auto",
            dry_run: bool = False, jobs: int = 2, echo: Echo | None = None,
            note: Echo | None = None) -> NightlyReport:
    """One nightly over the recipes *arguments* names (files or directories; none: every
    recipe the registry has recorded); see the module doc. *echo* gets one line per
    finished stage run, *note* the progress lines (stderr)."""
    say = note or (lambda _line: None)
    settings = Settings.from_env()
    ctx = Context()
    ctx.begin(registry=True)
    try:
        loaded: list[LoadedRecipe | RecipeReport] = (
            [load_recipe(path) for path in recipe_paths(arguments)] if arguments
            else recorded(ctx))
        if not loaded:
            raise UsageError("no recipe to requalify: name RECIPE files or directories, or "
                             "build one first (`enginectl build RECIPE` records it)")
        report = NightlyReport(started_at=utcnow(), executor=executor, dry_run=dry_run)
        keeper = None if dry_run else _LeaseKeeper(ctx, settings, say).acquire(report)
        failed = True
        run_id: int | None = None
        try:
            with ctx.registry.session() as session:
                last = nightly_runs.last_finished(session)
                before = nightly_runs.last_probes(session)
                run_id = None if dry_run else nightly_runs.start(
                    session, owner=keeper.owner if keeper else "", host=socket.gethostname())
            report.since = last.started_at if last else None
            pools: set[str] = set()
            probed_now: dict[str, dict[str, Any]] = {}
            for recipe in loaded:
                if isinstance(recipe, RecipeReport):
                    report.recipes.append(recipe)
                    continue
                _check(keeper)
                say(f"nightly: {recipe.recipe.display_name} ({recipe.path})")
                done, recipe_pools = _requalify(recipe, ctx, settings, before, executor=executor,
                                                address=address, dry_run=dry_run, jobs=jobs,
                                                echo=echo, probed_now=probed_now)
                report.recipes.append(done)
                pools |= recipe_pools
            _check(keeper)
            report.pools = _pool_reports(sorted(pools), before, probed_now)
            report.finished_at = utcnow()
            failed = False
            if run_id is not None:
                from pipeline.nightly.report import as_json

                with ctx.registry.session() as session:
                    nightly_runs.finish(session, run_id, status="finished",
                                        exit_code=report.exit_code, report=as_json(report))
        except BaseException as exc:
            _record_broken(ctx, run_id, keeper, exc)  # raises why, when the lease was lost
            raise
        finally:
            if keeper is not None:
                keeper.release(failed)
        return report
    finally:
        ctx.close()


def _check(keeper: _LeaseKeeper | None) -> None:
    """Go on only while this nightly holds its lease (`_LeaseKeeper.lost_error`)."""
    if keeper is not None and keeper.lost is not None:
        raise keeper.lost_error()


def _pool_reports(pools: Sequence[str], before: dict[str, records.ToolchainProbe],
                  probed_now: dict[str, dict[str, Any]]) -> list[PoolReport]:
    found = []
    for pool in pools:
        was, now = before.get(pool), probed_now.get(pool)
        found.append(PoolReport(
            pool, (now or {}).get("gpu") or (None if now is None else "CPU"),
            was.fingerprint if was else None, now, was.probed_at if was else None,
            toolchain_changes(was.fingerprint if was else None, now or {})))
    return found


def _record_broken(ctx: Context, run_id: int | None, keeper: _LeaseKeeper | None,
                   exc: BaseException) -> None:
    """Ctrl-C, an error or a lost lease ended the nightly: its row says how (if it has one);
    a lost lease is raised instead of what stopping the nightly raised."""
    why = exc if keeper is None or keeper.lost is None else keeper.lost_error()
    if run_id is not None:
        cancelled = isinstance(why, BuildCancelledError | KeyboardInterrupt)
        with ctx.registry.session() as session:
            nightly_runs.finish(session, run_id, status="cancelled" if cancelled else "failed",
                                exit_code=130 if cancelled else 1,
                                report={"error": " ".join(str(why).split())})
    if why is not exc:
        raise why from exc


def _requalify(
        loaded: LoadedRecipe, ctx: Context, settings: Settings,
        before: dict[str, records.ToolchainProbe], *, executor: str, address: str,
        dry_run: bool, jobs: int, echo: Echo | None,
        probed_now: dict[str, dict[str, Any]]) -> tuple[RecipeReport, set[str]]:
    """One recipe: probe (as its build does), re-plan, build what is missing, promote."""
    name = loaded.recipe.display_name
    done = RecipeReport(name, str(loaded.path), loaded.digest)
    try:
        probed = build_recipe(loaded.path, dry_run=True, ctx=Context(), run_on=executor,
                              address=address, loaded=loaded, promote=False,
                              record_probes=not dry_run)
    except EnginectlError as exc:
        done.error, done.exit_code = f"cannot plan or probe: {exc}", exc.exit_code
        return done, set()
    plan = probed.plan
    probed_now.update(probed.probes)
    pools = set(_pools_of(plan, executor)) & set(probed.probes) or set(probed.probes)
    missing = set(plan.stages) - built_keys(ctx.config.registry_url, set(plan.stages))
    if not missing:
        return done, pools
    old = _keyed_before(loaded, settings, executor, before)
    why: dict[tuple[str, str], KeyChange] = {}
    if old is not None:
        why = {(c.target, c.new_key): c for c in key_changes(old, plan)}
    with ctx.registry.session(readonly=True) as session:  # how they last ran, if ever
        runs = records.get_stage_runs(session, missing)
    summary: BuildSummary | None = None
    if not dry_run:
        try:
            built = build_recipe(loaded.path, jobs=jobs, keep_going=True, ctx=Context(),
                                 run_on=executor, address=address, loaded=loaded,
                                 promote=False, echo=echo, live=False, record_probes=False)
            summary = built.summary
            plan = built.plan
            missing &= set(plan.stages)
        except BuildCancelledError:
            raise
        except EnginectlError as exc:
            done.error, done.exit_code = f"build failed: {exc}", exc.exit_code
            return done, pools
    outcomes = _outcomes(summary)
    changed_smokes: set[str] = set()
    for planned in plan.targets:
        stages = [_stage_report(plan, key, why.get((planned.target.id, key)), runs.get(key),
                                outcomes.get(key), dry_run=dry_run)
                  for key in planned.chain if key in missing]
        if not stages:
            continue
        target = TargetReport(planned.target.id, stages)
        changed_smokes.add(planned.chain[-1])
        if summary is not None:
            target.levels = _levels(ctx, plan, old, planned.target.id, outcomes)
        done.targets.append(target)
    if summary is not None:
        by_target = {t.id: t for t in done.targets}
        for promotion in promote_gated(ctx, plan, summary, changed_smokes):
            by_target[promotion.target].promotions.append(promotion)
    return done, pools


def _stage_report(plan: Plan, key: str, change: KeyChange | None,
                  previous: records.StageRunRecord | None, outcome: Outcome | None, *,
                  dry_run: bool) -> StageReport:
    run = plan.stages[key]
    because = list(change.because) if change else [_unexplained(previous)]
    if dry_run:
        return StageReport(run.stage, key, because, "would run")
    if outcome is None:
        return StageReport(run.stage, key, because, "skipped")
    log = run.workdir / f"{run.stage}.log"
    shown = str(log) if outcome.status not in ("built", "reused") and log.is_file() else None
    return StageReport(run.stage, key, because, outcome.status, outcome.digest, outcome.error,
                       shown)


def _unexplained(run: records.StageRunRecord | None) -> str:
    """Why a key is missing that no toolchain change moved: a new target or recipe change,
    or a run that did not succeed (it failed, was stopped, or its smoke did not pass)."""
    if run is None:
        return "not built before"
    return f"its last run {run.status}" + (f" ({run.error[:120]})" if run.error else "")


def _levels(ctx: Context, plan: Plan, old: Plan | None, target_id: str,
            outcomes: dict[str, Outcome]) -> list[Level]:
    """The target's smoke throughput before (its artifact under the old keys) and now."""
    new_chain = next(p.chain for p in plan.targets if p.target.id == target_id)
    smoke = outcomes.get(new_chain[-1])
    if smoke is None or smoke.digest is None or smoke.status not in ("built", "reused"):
        return []
    old_chain = None if old is None else next(
        (p.chain for p in old.targets if p.target.id == target_id), None)
    gpu = plan.target(target_id).gpu.sku
    with ctx.registry.session(readonly=True) as session:
        new_report = latest_passing(records.smoke_reports(session, smoke.digest),
                                    key=new_chain[-1])
        old_report = None
        if old_chain is not None:
            entry = records.find_by_keys(session, {old_chain[-2]}).get(old_chain[-2])
            if entry is not None:
                old_report = latest_passing(records.smoke_reports(session, entry.digest),
                                            key=old_chain[-1], gpu=gpu)
    return compare_levels(old_report.report if old_report else None,
                          new_report.report if new_report else None, None)
