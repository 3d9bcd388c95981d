"""One stage run on this machine, the same whichever executor placed it here.

    lease    take the key's lease (a row in `stage_runs`); a live lease held by another
             builder means wait for it and reuse its result; an expired one is taken over
    run      materialise the inputs (this process's own outputs, else a fetch from the store
             through the cache), run the stage (external programs through the runner),
             validate its output; the lease's heartbeat renews it meanwhile, and when the
             lease is lost the run's children are stopped and the run fails with why,
             nothing of it published (`pipeline.executors.leaseguard`)
    publish  blobs, manifest, one registry transaction; release the lease with the run's log
             (stored as a blob)

A smoke run serves the entry or engine with its real server: `ready` on a pass, `quarantined`
on a failure, or left `built` with the reason when this machine lacks its GPU or runtime
(checked before the server starts, and read from a server that dies because its runtime is
missing: an error of this machine is never blamed on the artifact). An engine build or a
smoke run that needs more GPUs of its SKU than this machine has (tp × pp,
`pipeline.planning.capacity`) fails before it starts, with no lease taken and nothing
recorded: the artifact's status stays as it was.

Ctrl-C (`cancel`): the run's children are stopped, its lease is released `cancelled`, its
partial output is removed and nothing of it is published. A published output leaves the work
directory once no later run of the build reads it (`pipeline.executors.workdirs`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pipeline.errors import StageError
from pipeline.executors.leaseguard import LeaseGuard
from pipeline.executors.refit_smoke import StrippedSmoke, stripped_smoke
from pipeline.executors.work import StageJob, produce_output
from pipeline.executors.workdirs import WorkDirs
from pipeline.planning.capacity import on_this_node, run_need, shortfall
from pipeline.planning.outcome import Outcome, awaits_smoke, pending_smoke
from pipeline.planning.plan import Plan
from pipeline.planning.stage_run import StageRun
from pipeline.settings import Settings
from registry.context import Context
from registry.ops import history, logs
from registry.ops.fetch import load_manifest
from registry.ops.fetch_files import fetch_once
from registry.ops.publish import publish
from registry.sql import leases, records

RunStatus = Literal["succeeded", "failed", "cancelled"]
CANCELLED: Final = "cancelled by Ctrl-C; its partial output was removed"

GpuSlot = Callable[[str | None], AbstractContextManager[None]]
"""Holds the GPU of a SKU while a stage runs on it (the local executor's lock per SKU)."""


def _no_slot(_gpu: str | None) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def lookup(ctx: Context, keys: set[str]) -> dict[str, records.ArtifactRecord]:
    """The registry's artifacts for *keys*: one query, the only question a plan asks."""
    with ctx.registry.session(readonly=True) as session:
        return records.find_by_keys(session, keys)


def reused(ctx: Context, run: StageRun, record: records.ArtifactRecord,
           previous: leases.StageRunRecord | None = None) -> Outcome:
    """The outcome of reusing *record* for *run*, with the time its original run took."""
    if previous is None:
        with ctx.registry.session(readonly=True) as session:
            previous = leases.get_stage_run(session, run.key)
    saved = 0.0
    if previous is not None and previous.finished_at is not None:
        saved = (previous.finished_at - previous.started_at).total_seconds()
    return Outcome(run.stage, run.key, "reused", run.targets, digest=record.digest,
                   saved_seconds=saved)


@dataclass(frozen=True)
class WorkerSite:
    """Where a `StageWorker` runs, and as whom."""

    owner: str  # the build's lease owner (`pipeline.executors.local.owner_id`)
    local_gpu: str | None = None  # this machine's GPU SKU (None: no GPU)
    gpu_count: int | None = None
    """How many GPUs of `local_gpu` this machine has (None: not judged here, as on a Ray
    node, whose placement asked for them)."""
    node_id: str | None = None  # the Ray node this runs on, recorded on the stage-run row


class StageWorker:
    """Runs stage runs of *plan* on this machine (*site*). Thread-safe: the local executor
    shares one between its threads; a Ray task makes its own."""

    def __init__(self, plan: Plan, ctx: Context, settings: Settings, site: WorkerSite, *,
                 force: bool = False, keep_work: bool = False,
                 stop: threading.Event | None = None, gpu_slot: GpuSlot = _no_slot) -> None:
        self.plan, self.ctx, self.settings = plan, ctx, settings
        self.owner, self.force, self.local_gpu = site.owner, force, site.local_gpu
        self.gpu_count = site.gpu_count
        self.node_id = site.node_id
        self.stop = stop or threading.Event()
        self.cancel = threading.Event()
        """Set on Ctrl-C (after `stop`): runs in flight end `cancelled`, not `failed`."""
        self.gpu_slot = gpu_slot
        self.workdirs = WorkDirs(plan, ctx.store, keep=keep_work)
        self.lease_ttl_s = settings.lease_ttl_s
        self.poll_s = min(5.0, self.lease_ttl_s / 4)

    def run(self, run: StageRun, digests: Mapping[str, str]) -> Outcome:
        """Run *run* whose inputs' artifacts are *digests* (input key -> digest)."""
        started = time.monotonic()
        try:
            if self.cancel.is_set():
                return Outcome(run.stage, run.key, "cancelled", run.targets, error=CANCELLED)
            if run.stage == "smoke":
                return self._smoke(run, digests, started)
            if (refused := self._too_few_gpus(run)) is not None:
                return refused
            digest, built = self._leased(run, digests)
        except StageError as exc:
            cancelled = self.cancel.is_set()
            return Outcome(run.stage, run.key, "cancelled" if cancelled else "failed",
                           run.targets, seconds=time.monotonic() - started,
                           error=CANCELLED if cancelled else str(exc))
        finally:
            self.workdirs.finished(run)
        if not built:  # another builder made it while we waited for its lease
            with self.ctx.registry.session(readonly=True) as session:
                record = records.get_artifact(session, digest)
            assert record is not None  # noqa: S101 - the lookup just found it
            return reused(self.ctx, run, record)
        return Outcome(run.stage, run.key, "built", run.targets, digest=digest,
                       seconds=time.monotonic() - started)

    def _too_few_gpus(self, run: StageRun, entry: str | None = None) -> Outcome | None:
        """The failure of *run* when this machine has fewer GPUs of its SKU than it needs:
        this machine's fault, found before anything starts or is recorded."""
        need = run_need(self.plan, run)
        if need is None or self.gpu_count is None:
            return None
        short = shortfall(need, on_this_node(self.local_gpu, self.gpu_count))
        if short is None:
            return None
        return Outcome(run.stage, run.key, "failed", run.targets, digest=entry,
                       error=str(short))

    def _smoke(self, run: StageRun, digests: Mapping[str, str], started: float) -> Outcome:
        from pipeline.serving.smoke_here import unavailable

        entry = digests[run.inputs[0]]
        with self.ctx.registry.session(readonly=True) as session:
            record = records.get_artifact(session, entry)
            previous = leases.get_stage_run(session, run.key)
        if record is not None and record.status in ("ready", "superseded") \
                and previous is not None and previous.status == "succeeded" and not self.force:
            return Outcome(run.stage, run.key, "reused", run.targets, digest=entry)
        reason = unavailable(run, self.settings, self.local_gpu)
        if reason is not None:
            return self._awaits_smoke(run, entry, record, reason)
        if (refused := self._too_few_gpus(run, entry)) is not None:
            return refused
        served = self._served_digests(run, digests)
        stripped = stripped_smoke(self.plan, run, lambda key: self._input_dir(key, served))
        if stripped is not None and (reason := stripped.unavailable()) is not None:
            return self._awaits_smoke(run, entry, record, reason)
        argv = run.make_argv(stripped.dirs if stripped else lambda key: self._input_dir(
            key, served), run.workdir / "out")  # a stripped engine: the refitted one
        if argv is None:
            raise StageError(run.stage, run.key, "no server argv")
        verdict = self._smoke_lease(run, entry)  # records who smoked it, and when
        if verdict is not None:
            return verdict
        guard = self._guard(run)
        try:
            return self._judge(run, entry, record, argv, started, guard=guard,
                               stripped=stripped)
        except BaseException as exc:
            guard.end()
            if guard.lost is not None and not self.cancel.is_set():
                raise guard.error() from exc
            raise
        finally:
            guard.end()

    def _judge(self, run: StageRun, entry: str, record: records.ArtifactRecord | None,
               argv: list[str], started: float, *, guard: LeaseGuard,
               stripped: StrippedSmoke | None = None) -> Outcome:
        """Serve *entry* with *argv* under the smoke run's lease, and record the verdict
        (none when the lease was lost meanwhile: the server was stopped under it). A
        *stripped* engine is refitted first, and held `built` without refit equivalence."""
        from pipeline.serving.verdict import Judged, SmokeJob, conclude, judge

        target = self.plan.target(run.targets[0])
        recipe = self.plan.loaded.recipe
        job = SmokeJob(
            entry, argv, run.workdir, recipe.model.name, recipe.smoke, target.quant,
            target.shape.max_input_len, recipe.smoke.gpu_price_per_hour.get(target.gpu.sku),
            self._log(run), target.gpu.is_cpu, run.workdir / "serve",
            gpus=1 if target.gpu.is_cpu else target.tp * target.pp)
        refused = stripped.refit(self._log(run)) if stripped is not None else None
        judged = (Judged(entry, refused, None, None, log_path=self._log(run)) if refused
                  else judge(self.ctx, self.settings, job, cancelled=self.cancel.is_set))
        report = judged.report
        guard.check()
        if self.cancel.is_set():  # the server was stopped under it: no evidence either way
            self._release(run, "cancelled", None, error=CANCELLED)
            return Outcome(run.stage, run.key, "cancelled", run.targets, digest=entry,
                           error=CANCELLED)
        if judged.fault is not None:  # the server died for want of its runtime, not the artifact
            self._release(run, "failed", None, error=judged.fault)
            return self._awaits_smoke(run, entry, record, judged.fault)
        held = None if stripped is None or not report.passed else stripped.equivalence(
            self.ctx, entry, report, job=job, force=self.force, slot=self.gpu_slot(run.gpu))
        conclude(self.ctx, judged, gpu=target.gpu.sku, toolchain=dict(run.toolchain),
                 key=run.key, held=held)
        self._release(run, "succeeded" if report.passed else "failed", entry,
                      error=report.failure)
        seconds = time.monotonic() - started
        if report.passed:
            return Outcome(run.stage, run.key, "built", run.targets, seconds=seconds,
                           digest=entry)
        return Outcome(run.stage, run.key, "smoke-failed", run.targets, seconds=seconds,
                       digest=entry, error=f"{entry} quarantined: {report.failure}")

    def _smoke_lease(self, run: StageRun, entry: str) -> Outcome | None:
        """Take the smoke run's lease (None), or, while another builder holds it, wait for
        its verdict and take that: ready is reused, quarantined is this run's failure too."""
        waited = False
        while True:
            with self.ctx.registry.session() as session:
                got = leases.try_acquire_lease(session, run.key, owner=self.owner,
                                               host=socket.gethostname(), pid=os.getpid(),
                                               ttl_s=self.lease_ttl_s, node_id=self.node_id)
            if got and not waited:
                return None
            if got:  # the other builder finished: its verdict, not a second smoke
                with self.ctx.registry.session(readonly=True) as session:
                    record = records.get_artifact(session, entry)
                if record is not None and record.status in ("ready", "quarantined"):
                    passed = record.status == "ready"
                    self._release(run, "succeeded" if passed else "failed", entry,
                                  error=None if passed else record.status_reason)
                    if passed:
                        return Outcome(run.stage, run.key, "reused", run.targets, digest=entry)
                    return Outcome(run.stage, run.key, "smoke-failed", run.targets,
                                   digest=entry, error=f"{entry} quarantined by another "
                                   f"builder's smoke: {record.status_reason}")
                return None  # it gave up without a verdict: smoke it here
            if self.stop.is_set():
                raise StageError(run.stage, run.key, "stopped while waiting for another builder")
            waited = True
            self.stop.wait(self.poll_s)

    def _leased(self, run: StageRun, digests: Mapping[str, str]) -> tuple[str, bool]:
        """Run *run* under its lease, or wait for the builder holding it and reuse its
        artifact: (digest, whether this builder built it)."""
        host = socket.gethostname()
        while True:
            asked = time.monotonic()
            with self.ctx.registry.session() as session:
                got = leases.try_acquire_lease(session, run.key, owner=self.owner, host=host,
                                               pid=os.getpid(), ttl_s=self.lease_ttl_s,
                                               node_id=self.node_id)
            if got:
                break
            found = lookup(self.ctx, {run.key}).get(run.key)
            if found is not None:
                return found.digest, False
            if self.stop.is_set():
                raise StageError(run.stage, run.key, "stopped while waiting for another builder")
            self.stop.wait(self.poll_s)  # another builder holds the lease: poll until it ends
        found = None if self.force else lookup(self.ctx, {run.key}).get(run.key)
        if found is not None:  # it finished between our lookup and the lease
            self._release(run, "succeeded", found.digest)
            return found.digest, False
        guard = self._guard(run, taken_at=asked)
        try:
            digest = self._build(run, digests, guard)
        except BaseException as exc:
            guard.end()
            if guard.lost is not None and not self.cancel.is_set():
                raise guard.error() from exc  # not ours any more: nothing to release
            if self.cancel.is_set():
                self._release(run, "cancelled", None, error=CANCELLED)
                _remove_partial(run)
            else:
                self._release(run, "failed", None, error=str(exc)[:2000])
            raise
        guard.end()
        self._release(run, "succeeded", digest)
        return digest, True

    def abandon(self, run: StageRun) -> None:
        """Ctrl-C found *run* still busy in this process (a download, an upload): release
        its lease `cancelled` now; the thread is dropped with the process."""
        self._release(run, "cancelled", None, error="interrupted while it ran in-process")

    def _awaits_smoke(self, run: StageRun, entry: str, record: records.ArtifactRecord | None,
                      reason: str) -> Outcome:
        """This machine cannot smoke *run*: the entry stays as it is, with the reason."""
        why = awaits_smoke(reason)
        if record is not None and record.status == "built" and record.status_reason != why:
            with self.ctx.registry.session() as session:  # shown by ls and show
                history.set_status_and_record(self.ctx.store, session, entry, "built", why)
        return pending_smoke(run.stage, run.key, run.targets, entry=entry, gpu=run.gpu,
                             reason=reason)

    def _served_digests(self, run: StageRun, digests: Mapping[str, str]) -> dict[str, str]:
        """*digests* plus what the smoke server reads beyond the entry: the checkpoint the
        entry was made from (its manifest's input), even when both were reused."""
        served = dict(digests)
        entry_run = self.plan.stages.get(run.inputs[0])
        if entry_run is not None and entry_run.inputs and entry_run.inputs[0] not in served:
            inputs = load_manifest(self.ctx, digests[run.inputs[0]]).inputs
            if inputs:
                served[entry_run.inputs[0]] = inputs[0]
        return served

    def _release(self, run: StageRun, status: RunStatus,
                 digest: str | None, error: str | None = None) -> None:
        """Release the lease with the run's log, stored as a blob gc keeps (`enginectl
        logs` and `enginectl show` name it)."""
        logs.release_lease_with_log(self.ctx, run.key, owner=self.owner, status=status,
                                    artifact_digest=digest, error=error, log=self._log(run))

    def _log(self, run: StageRun) -> Path:
        return run.workdir / f"{run.stage}.log"

    def _guard(self, run: StageRun, *, taken_at: float | None = None) -> LeaseGuard:
        """The heartbeat of *run*'s lease, which this builder holds from now on."""
        return LeaseGuard(self.ctx.registry, run, owner=self.owner, ttl_s=self.lease_ttl_s,
                          log=self._log(run), taken_at=taken_at)

    def _input_dir(self, key: str, digests: Mapping[str, str]) -> Path:
        """A local directory with the files of input *key*: this process's output, or a
        fetch from the store (through the cache, so it is free the second time)."""
        found = self.workdirs.get(key)
        if found is not None and found.is_dir():
            return found
        digest = digests[key]
        target = fetch_once(self.ctx.store, lambda: load_manifest(self.ctx, digest),
                            self.settings.input_dir(digest), cache=self.ctx.cache)
        self.workdirs.fetched(key, target)
        return target

    def _build(self, run: StageRun, digests: Mapping[str, str], guard: LeaseGuard) -> str:
        with self.gpu_slot(run.gpu):
            guard.check()
            job = StageJob(
                plan=self.plan, run=run, settings=self.settings,
                inputs={key: self._input_dir(key, digests) for key in run.inputs},
                input_digests=tuple(digests[key] for key in run.inputs),
                log_path=self._log(run), store=self.ctx.store,
                s3_endpoint_url=self.ctx.config.s3_endpoint_url,
            )
            result = produce_output(job)
        guard.check()  # its tool may have ended before the loss stopped it: publish nothing
        published = publish(
            self.ctx, result.directory, kind=run.kind, labels=result.labels,
            status="built", key=run.key, toolchain=run.toolchain,
            inputs=job.input_digests, serve=result.serve,
            recipe_digest=self.plan.loaded.digest,
        )
        self.workdirs.published(run, result.directory, published.manifest)
        return published.digest


def _remove_partial(run: StageRun) -> None:
    """What a cancelled run wrote (never a local source: snapshots of those write nothing)."""
    shutil.rmtree(run.workdir / "out", ignore_errors=True)
