"""nightly: notice every toolchain bump, rebuild and re-prove what it invalidates, and promote
only what is no worse (DESIGN §6, the `enginectl nightly` verb).

    lease     one nightly at a time: the nightly lease (`registry.sql.leases`); a second one waits
              for the first and then finds nothing to do
    probe     each recipe's pools, as its build probes them (this machine for the local
              executor, each Ray pool for --executor ray), recorded; diffed with the probe of
              that pool recorded before this run
    re-plan   every recipe keyed with the new fingerprints: a key the registry lacks is what
              changed; each is explained by the fingerprint fields its key takes that differ
    build     the recipe's build (keep-going: one failing target never blocks the others),
              which reuses everything still keyed the same and re-smokes entries whose smoke
              key moved (a requalified entry keeps its digest; a rebuilt engine is new); a
              target whose GPU this machine lacks (local executor) is skipped, not built
    promote   the gated rule of `pipeline.serving.promote` for the channels whose target changed
    alarm     each artifact proven again this run against its own last proof on the
              previous fingerprint (`pipeline.nightly.alarm`): a toolchain regression
    report    one verdict per target (`pipeline.nightly.verdict`), with what it
              invalidated and old and new throughput; recorded in `nightly_runs`

A run where nothing is missing changes nothing and says since when (the last nightly).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.errors import BuildCancelledError, FleetError
from pipeline.executors.build import build_recipe
from pipeline.executors.result import BuildOptions
from pipeline.nightly.alarm import (
    Regression,
    confirmed,
    incumbent_regression,
    regression,
    target_levels,
)
from pipeline.nightly.diff import key_changes, toolchain_changes
from pipeline.nightly.lease import LeaseKeeper
from pipeline.nightly.settle import settle
from pipeline.nightly.stages import stage_report
from pipeline.nightly.verdict import (
    NightlyReport,
    PoolReport,
    RecipeReport,
    TargetReport,
)
from pipeline.planning.outcome import BuildSummary, Outcome
from pipeline.planning.plan import Plan, plan_recipe
from pipeline.planning.source import read_recipe, with_source_read
from pipeline.planning.toolchain import (
    BUILDER_IMAGE,
    PoolToolchains,
    Toolchain,
    for_plan,
    from_dict,
)
from pipeline.recipe.reader import LoadedRecipe, parse_recipe
from pipeline.serving.abgate import remeasure
from pipeline.serving.promote import Promotion, latest_passing, promote_gated
from pipeline.settings import Settings
from registry.context import Context
from registry.errors import EnginectlError, UsageError
from registry.progress import Echo
from registry.sql import build_inputs, leases, nightly_runs, smoke_records
from registry.sql.lookup import built_keys
from registry.sql.models import utcnow


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
        rows = build_inputs.recorded_recipes(session)
    found: list[LoadedRecipe | RecipeReport] = []
    for row in rows:
        try:
            found.append(with_source_read(parse_recipe(Path(row.path), row.text)))
        except EnginectlError as exc:
            found.append(RecipeReport(row.name, row.path, row.digest,
                                      error=f"cannot read the recorded recipe: {exc}",
                                      exit_code=exc.exit_code))
    return found


def _pools_of(plan: Plan, executor: str) -> list[str]:
    from pipeline.planning.probe import local_pool

    if executor == "local":
        return [local_pool()]
    return sorted(plan.toolchains.by_gpu)


def _keyed_before(loaded: LoadedRecipe, settings: Settings, executor: str,
                  before: dict[str, build_inputs.ToolchainProbe]) -> Plan | None:
    """The plan as the probes recorded before this run key it (None: no probe to key with)."""
    pins = loaded.recipe.toolchain

    def recorded_toolchain(pool: str) -> Toolchain | None:
        probe = before.get(pool)
        return None if probe is None else for_plan(from_dict(probe.fingerprint), pins)[0]

    if executor == "local":
        from pipeline.planning.probe import local_pool

        found = recorded_toolchain(local_pool())
        return None if found is None else plan_recipe(loaded, settings, found)
    from pipeline.executors.groups import pool_toolchain
    from pipeline.executors.pools import CPU_POOL

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


def nightly(arguments: Sequence[Path] = (), *, ctx: Context, settings: Settings,
            executor: str = "local", address: str = "auto", dry_run: bool = False,
            jobs: int = 2, echo: Echo | None = None, note: Echo | None = None,
            accept_regression: bool = False) -> NightlyReport:
    """One nightly over the recipes *arguments* names (files or directories; none: every
    recipe the registry of *ctx* has recorded), in that registry and store, with
    *settings*; see the module doc. The caller made *ctx* and closes it. *echo* gets one
    line per finished stage run, *note* the progress lines (stderr). *accept_regression*
    lets the aliases of a pool whose toolchain regressed move (`settle`)."""
    say = note or (lambda _line: None)
    ctx.begin(registry=True)
    loaded: list[LoadedRecipe | RecipeReport] = (
        [read_recipe(path) for path in recipe_paths(arguments)] if arguments
        else recorded(ctx))
    if not loaded:
        raise UsageError("no recipe to requalify: name RECIPE files or directories, or "
                         "build one first (`enginectl build RECIPE` records it)")
    if executor == "ray":  # a cluster that is not there: said now, nothing recorded
        _check_cluster(address)
    report = NightlyReport(started_at=utcnow(), executor=executor, dry_run=dry_run,
                           accept_regression=accept_regression)
    keeper = None if dry_run else LeaseKeeper(ctx, settings, say).acquire(report)
    failed = True
    run_id: int | None = None
    try:
        with ctx.registry.session() as session:
            last = nightly_runs.last_finished(session)
            base = nightly_runs.baseline(session)
            run_id = None if dry_run else nightly_runs.start(
                session, owner=keeper.owner if keeper else "", host=socket.gethostname())
        report.since = last.started_at if last else None
        run = _Run(ctx, settings, base.probes, base.at or report.started_at,
                   executor=executor, address=address, dry_run=dry_run, jobs=jobs,
                   echo=echo)
        pools: set[str] = set()
        for recipe in loaded:
            if isinstance(recipe, RecipeReport):
                report.recipes.append(recipe)
                continue
            _check(keeper)
            say(f"nightly: {recipe.recipe.display_name} ({recipe.path})")
            done, recipe_pools = _requalify(recipe, run)
            report.recipes.append(done)
            pools |= recipe_pools
        _check(keeper)
        settle(ctx, run.pending, report.targets, accept_regression=accept_regression)
        report.pools = _pool_reports(sorted(pools), run.before, run.probed_now)
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


def _check_cluster(address: str) -> None:
    """FleetError (exit 2) when nothing at *address* answers as a Ray cluster does (or Ray
    is not installed here): before the nightly takes its lease or records a run."""
    from pipeline.executors.fleet import require_ray

    require_ray()
    from pipeline.executors.ray_cluster import check_reachable

    check_reachable(address)


def _check(keeper: LeaseKeeper | None) -> None:
    """Go on only while this nightly holds its lease (`LeaseKeeper.lost_error`)."""
    if keeper is not None and keeper.lost is not None:
        raise keeper.lost_error()


def _pool_reports(pools: Sequence[str], before: dict[str, build_inputs.ToolchainProbe],
                  probed_now: dict[str, dict[str, Any]]) -> list[PoolReport]:
    found = []
    for pool in pools:
        was, now = before.get(pool), probed_now.get(pool)
        found.append(PoolReport(
            pool, (now or {}).get("gpu") or (None if now is None else "CPU"),
            was.fingerprint if was else None, now, was.probed_at if was else None,
            toolchain_changes(was.fingerprint if was else None, now or {})))
    return found


def _record_broken(ctx: Context, run_id: int | None, keeper: LeaseKeeper | None,
                   exc: BaseException) -> None:
    """Ctrl-C, an error or a lost lease ended the nightly: its row says how (if it has one);
    a lost lease is raised instead of what stopping the nightly raised."""
    why = exc if keeper is None or keeper.lost is None else keeper.lost_error()
    if run_id is not None:
        cancelled = isinstance(why, BuildCancelledError | KeyboardInterrupt)
        code = 130 if cancelled else why.exit_code if isinstance(why, EnginectlError) else 1
        with ctx.registry.session() as session:
            nightly_runs.finish(session, run_id, status="cancelled" if cancelled else "failed",
                                exit_code=code,
                                report={"error": " ".join(str(why).split())})
    if why is not exc:
        raise why from exc


@dataclass
class _Run:
    """What every recipe of one nightly is requalified with, and what it gathers."""

    ctx: Context
    settings: Settings
    before: dict[str, build_inputs.ToolchainProbe]  # the baseline's probes
    since: datetime  # proofs from then on are this work's (`nightly_runs.Baseline.at`)
    executor: str
    address: str
    dry_run: bool
    jobs: int
    echo: Echo | None
    probed_now: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: list[tuple[Plan, Promotion]] = field(default_factory=list)  # for `settle`


def _requalify(loaded: LoadedRecipe, run: _Run) -> tuple[RecipeReport, set[str]]:
    """One recipe: probe (as its build does), re-plan, build what the baseline's plan
    lacks (keys missing from the registry, and keys that moved since the baseline, which a
    nightly that did not settle may have built already), gate; the moves that the gate let
    through are added to `run.pending` (`settle`)."""
    done = RecipeReport(loaded.recipe.display_name, str(loaded.path), loaded.digest)
    ctx, executor = run.ctx, run.executor
    try:
        probed = build_recipe(loaded.path, ctx=ctx, settings=run.settings, loaded=loaded,
                              options=BuildOptions(dry_run=True, run_on=executor,
                                                   address=run.address, promote=False,
                                                   record_probes=not run.dry_run))
    except FleetError:
        raise  # the cluster's fault, not the recipe's: the nightly stops (exit 2)
    except EnginectlError as exc:
        done.error, done.exit_code = f"cannot plan or probe: {exc}", exc.exit_code
        return done, set()
    plan = probed.plan
    run.probed_now.update(probed.probes)
    pools = set(_pools_of(plan, executor)) & set(probed.probes) or set(probed.probes)
    missing = set(plan.stages) - built_keys(ctx.config.registry_url, set(plan.stages))
    lacking = _lacking_gpu(plan, probed.probes) if executor == "local" else {}
    old = _keyed_before(loaded, run.settings, executor, run.before)
    why = {} if old is None else {(c.target, c.new_key): c for c in key_changes(old, plan)}
    todo = missing | {key for _target, key in why}
    if not todo:
        done.targets = [TargetReport(p.target.id) for p in plan.targets]
        return done, pools
    with ctx.registry.session(readonly=True) as session:  # how they last ran, if ever
        runs = leases.get_stage_runs(session, todo)
    runnable = {p.target.gpu.sku for p in plan.targets if p.target.id not in lacking
                and set(p.chain) & todo}
    summary: BuildSummary | None = None
    if not run.dry_run and runnable:
        try:
            only = f"{runnable.pop()}/*" if lacking and len(runnable) == 1 else None
            built = build_recipe(loaded.path, ctx=ctx, settings=run.settings, loaded=loaded,
                                 planned=probed.planned, options=BuildOptions(
                                     jobs=run.jobs, only=only, keep_going=True,
                                     run_on=executor, address=run.address, promote=False,
                                     echo=run.echo, live=False, record_probes=False))
            summary = built.summary
            plan = built.plan
            todo &= set(plan.stages)
        except BuildCancelledError:
            raise
        except EnginectlError as exc:
            done.error, done.exit_code = f"build failed: {exc}", exc.exit_code
            return done, pools
    outcomes = _outcomes(summary)
    changed_smokes: set[str] = set()
    for planned in plan.targets:
        stages = [stage_report(plan, key, why.get((planned.target.id, key)), runs.get(key),
                               outcomes.get(key), dry_run=run.dry_run)
                  for key in planned.chain if key in todo]
        target = TargetReport(planned.target.id, stages)
        done.targets.append(target)
        if stages and planned.target.id in lacking:
            target.skipped = lacking[planned.target.id]
        elif stages:
            changed_smokes.add(planned.chain[-1])
            if summary is not None:
                target.levels, target.start = target_levels(ctx, plan, old, planned.target.id,
                                                            outcomes)
    if summary is not None:
        _gate(run, plan, done.targets, summary, changed_smokes)
    return done, pools


def _gate(run: _Run, plan: Plan, targets: list[TargetReport], summary: BuildSummary,
          changed_smokes: set[str]) -> None:
    """The promotion gate of each channel whose smoke is in *changed_smokes* (its moves
    left to `settle`), then the alarm (`_judge`)."""
    by_target = {t.id: t for t in targets}
    for promotion in promote_gated(run.ctx, run.settings, plan, summary, changed_smokes,
                                   move=False):
        by_target[promotion.target].promotions.append(promotion)
        run.pending += [(plan, promotion)] if promotion.action == "pending" else []
    _judge(run, plan, targets, _outcomes(summary))


def _lacking_gpu(plan: Plan, probes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Target id -> why this machine cannot run it, for every GPU target of a SKU this
    machine does not have (the local executor's probe says which GPU it has, if any)."""
    from pipeline.planning.probe import local_pool

    here = (probes.get(local_pool()) or {}).get("gpu")
    return {p.target.id: f"needs a {p.target.gpu.sku} and this machine has {here or 'no GPU'}"
            for p in plan.targets if not p.target.gpu.is_cpu and p.target.gpu.sku != here}


def _judge(run: _Run, plan: Plan, targets: list[TargetReport],
           outcomes: dict[str, Outcome]) -> None:
    """The toolchain regression alarm (`pipeline.nightly.alarm`) for each target proven in
    this run (its entry re-proved, and the incumbent of each alias the gate measured), and
    the log or smoke report each verdict comes from."""
    ctx, since = run.ctx, run.since
    threshold = plan.loaded.recipe.nightly.max_regression
    suspects: list[tuple[TargetReport, Regression]] = []
    with ctx.registry.session(readonly=True) as session:
        for target in targets:
            if target.skipped is not None or not target.stages:
                continue
            planned = next(p for p in plan.targets if p.target.id == target.id)
            gpu, smoke = planned.target.gpu.sku, planned.chain[-1]
            proof = outcomes.get(smoke)
            failed = target.failed_stage
            target.evidence = failed.log if failed is not None else None
            if proof is None or proof.digest is None or proof.status not in ("built",
                                                                              "reused"):
                continue
            reports = smoke_records.smoke_reports(session, proof.digest)
            shown = latest_passing(reports, key=smoke)
            if shown is not None and target.evidence is None:
                target.evidence = shown.report.get("log_path")
            found = regression(session, proof.digest, gpu, threshold, key=smoke, since=since)
            suspects += [(target, found)] if found else []
            if shown is None or shown.toolchain is None:
                continue
            for promotion in target.promotions:
                found = incumbent_regression(session, promotion, gpu, threshold,
                                            shown.toolchain)
                suspects += [(target, found)] if found else []
    for target, suspect in suspects:  # served again here, after the registry is let go
        rounds = remeasure(ctx, run.settings, suspect.digest,
                           rounds=plan.loaded.recipe.nightly.gate_rounds,
                           log_dir=run.settings.work_dir / "alarm"
                           / suspect.digest.removeprefix("sha256:")[:16])
        found = suspect if rounds is None else confirmed(suspect, rounds)
        target.regressions += [found] if found else []
