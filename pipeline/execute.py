"""The local executor: walk the plan DAG, reuse what the registry has, run the rest.

For each stage run, in an order where inputs come first:

  hit    the registry maps its key to an artifact that is not deleted or quarantined: reuse
  lease  otherwise take the key's lease (a row in `stage_runs`); a live lease held by another
         builder means wait for it and reuse its result; an expired one is taken over
  run    materialise the inputs, run the stage (external programs through the runner),
         validate, publish (blobs, manifest, one registry transaction), release the lease

Independent runs go in parallel up to `jobs`; runs on the same GPU SKU never overlap. Smoke
runs are left to `enginectl smoke`: their artifacts stay `built`.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pipeline.errors import StageError
from pipeline.plan import Plan, StageRun
from pipeline.runner import stop_all
from pipeline.settings import Settings
from pipeline.stages.work import StageJob, run_stage
from registry import records
from registry.context import Context
from registry.digest import digest_file
from registry.fetch import fetch_manifest, load_manifest
from registry.publish import publish

Status = Literal["built", "reused", "failed", "skipped", "waiting", "pending-smoke",
                 "smoke-failed"]
LEASE_TTL_S: Final = float(os.environ.get("ENGINECTL_LEASE_TTL_S", "120"))
POLL_S: Final = min(5.0, LEASE_TTL_S / 4)


@dataclass
class Outcome:
    stage: str
    key: str
    status: Status
    targets: list[str]
    seconds: float = 0.0
    digest: str | None = None
    error: str | None = None
    saved_seconds: float = 0.0  # for a reuse: how long the original run took

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "key": self.key, "status": self.status,
                "targets": self.targets, "seconds": round(self.seconds, 3),
                "digest": self.digest, "error": self.error,
                "saved_seconds": round(self.saved_seconds, 3)}


@dataclass
class BuildSummary:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "built": self.count("built"), "reused": self.count("reused"),
            "failed": self.count("failed"), "skipped": self.count("skipped"),
            "pending_smoke": self.count("pending-smoke"),
            "smoke_failed": self.count("smoke-failed"),
            "saved_seconds": round(sum(o.saved_seconds for o in self.outcomes), 3),
            "stages": [o.as_dict() for o in self.outcomes],
        }


Reporter = Callable[[Outcome], None]
Starter = Callable[[StageRun], None]


def selected_keys(plan: Plan, only: str | None) -> set[str]:
    """The keys the targets matching *only* (a glob over target ids) need."""
    keys: set[str] = set()
    for planned in plan.targets:
        if only is None or fnmatch.fnmatch(planned.target.id, only):
            keys.update(planned.chain)
    return keys


def lookup(ctx: Context, keys: set[str]) -> dict[str, records.ArtifactRecord]:
    """The registry's artifacts for *keys*: one query, the only question a plan asks."""
    with ctx.registry.session(readonly=True) as session:
        return records.find_by_keys(session, keys)


class Executor:
    def __init__(self, plan: Plan, ctx: Context, settings: Settings, *, jobs: int = 1,
                 force: bool = False, keep_going: bool = False,
                 report: Reporter | None = None, started: Starter | None = None,
                 local_gpu: str | None = None) -> None:
        self.plan, self.ctx, self.settings = plan, ctx, settings
        self.jobs, self.force, self.keep_going = max(1, jobs), force, keep_going
        self.report = report or (lambda _outcome: None)
        self.started = started or (lambda _run: None)
        self.local_gpu = local_gpu
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.digests: dict[str, str] = {}  # key -> artifact digest, as runs finish
        self.outputs: dict[str, Path] = {}  # key -> a local directory holding its files
        self.gpu_locks: dict[str, threading.Lock] = {}
        self.stop = threading.Event()
        self.previous_runs: dict[str, records.StageRunRecord] = {}

    def run(self, keys: set[str]) -> BuildSummary:
        summary = BuildSummary()
        hits = {} if self.force else lookup(self.ctx, keys)
        if hits:
            with self.ctx.registry.session(readonly=True) as session:
                self.previous_runs = records.get_stage_runs(session, set(hits))
        order = [key for key in self.plan.stages if key in keys]
        pending = dict.fromkeys(order)
        running: dict[Future[Outcome], str] = {}
        done: set[str] = set()
        blocked: set[str] = set()
        with ThreadPoolExecutor(self.jobs) as pool:
            try:
                self._loop(pool, summary, hits=hits, pending=pending, running=running,
                           done=done, blocked=blocked)
            except BaseException:
                # Ctrl-C (or a bug): stop every child so the workers return, and let them
                # release their leases before the pool is left.
                self.stop.set()
                stop_all()
                from pipeline.smoke import stop_all as stop_servers

                stop_servers()
                raise
        return summary

    def _loop(self, pool: ThreadPoolExecutor, summary: BuildSummary, *,
              hits: dict[str, records.ArtifactRecord], pending: dict[str, None],
              running: dict[Future[Outcome], str], done: set[str], blocked: set[str]) -> None:
        while pending or running:
            for key in list(pending):
                run = self.plan.stages[key]
                if any(i in blocked for i in run.inputs):
                    pending.pop(key)
                    blocked.add(key)
                    summary.outcomes.append(self._emit(Outcome(
                        run.stage, key, "skipped", run.targets, error="an input failed")))
                elif key in hits:
                    pending.pop(key)
                    done.add(key)
                    summary.outcomes.append(self._emit(self._reuse(run, hits[key])))
                elif all(i in done for i in run.inputs) and len(running) < self.jobs \
                        and not self.stop.is_set():
                    pending.pop(key)
                    running[pool.submit(self._one, run)] = key
            if not running:
                if pending and self.stop.is_set():
                    for key in pending:
                        run = self.plan.stages[key]
                        summary.outcomes.append(self._emit(Outcome(
                            run.stage, key, "skipped", run.targets, error="stopped")))
                    pending.clear()
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                key = running.pop(future)
                outcome = future.result()
                summary.outcomes.append(self._emit(outcome))
                if outcome.status == "failed":
                    blocked.add(key)
                    if not self.keep_going:
                        self.stop.set()
                else:
                    done.add(key)

    def _emit(self, outcome: Outcome) -> Outcome:
        self.report(outcome)
        return outcome

    def _reuse(self, run: StageRun, record: records.ArtifactRecord) -> Outcome:
        self.digests[run.key] = record.digest
        previous = self.previous_runs.get(run.key)
        if previous is None:
            with self.ctx.registry.session(readonly=True) as session:
                previous = records.get_stage_run(session, run.key)
        saved = 0.0
        if previous is not None and previous.finished_at is not None:
            saved = (previous.finished_at - previous.started_at).total_seconds()
        return Outcome(run.stage, run.key, "reused", run.targets, digest=record.digest,
                       saved_seconds=saved)

    def _one(self, run: StageRun) -> Outcome:
        started = time.monotonic()
        self.started(run)
        if run.stage == "smoke":
            return self._smoke(run, started)
        try:
            digest, built = self._leased(run)
        except StageError as exc:
            return Outcome(run.stage, run.key, "failed", run.targets,
                           seconds=time.monotonic() - started, error=str(exc))
        if not built:  # another builder made it while we waited for its lease
            with self.ctx.registry.session(readonly=True) as session:
                record = records.get_artifact(session, digest)
            assert record is not None  # noqa: S101 - the lookup just found it
            return self._reuse(run, record)
        return Outcome(run.stage, run.key, "built", run.targets, digest=digest,
                       seconds=time.monotonic() - started)

    def _smoke(self, run: StageRun, started: float) -> Outcome:
        """Serve the entry or engine with its real server; `ready` on a pass, `quarantined`
        on a failure; left `built` when this machine lacks the GPU or the runtime."""
        from pipeline.stages.smoke import run_smoke, unavailable

        entry = self.digests[run.inputs[0]]
        with self.ctx.registry.session(readonly=True) as session:
            record = records.get_artifact(session, entry)
            previous = records.get_stage_run(session, run.key)
        if record is not None and record.status == "ready" and previous is not None \
                and previous.status == "succeeded" and not self.force:
            return Outcome(run.stage, run.key, "reused", run.targets, digest=entry)
        reason = unavailable(run, self.settings, self.local_gpu)
        if reason is not None:
            why = f"awaits smoke: {reason}"
            if record is not None and record.status == "built" and record.status_reason != why:
                with self.ctx.registry.session() as session:  # shown by ls and show
                    records.set_status(session, entry, "built", why)
            return Outcome(run.stage, run.key, "pending-smoke", run.targets, digest=entry,
                           error=f"stays built: {reason}; run `enginectl smoke {entry}` "
                                 f"on a {run.gpu} node")
        target = next(t.target for t in self.plan.targets if t.target.id == run.targets[0])
        recipe = self.plan.loaded.recipe
        argv = run.make_argv(self._input_dir, run.workdir / "out")
        if argv is None:
            raise StageError(run.stage, run.key, "no server argv")
        with self.ctx.registry.session() as session:  # records who smoked it, and when
            records.try_acquire_lease(session, run.key, owner=self.owner,
                                      host=socket.gethostname(), pid=os.getpid(), ttl_s=3600)
        report = run_smoke(
            argv, model_dir=run.workdir, served_name=recipe.model.name, settings=recipe.smoke,
            max_input_len=target.shape.max_input_len,
            price_per_hour=recipe.smoke.gpu_price_per_hour.get(target.gpu.sku),
            log_path=self._log(run), cpu=target.gpu.is_cpu,
            reference=[(r.prompt, r.output) for r in recipe.smoke.reference] or None,
            threshold=None if target.quant in ("bf16", "fp16")
            else recipe.smoke.reference_agreement,
        )
        with self.ctx.registry.session() as session:
            records.add_smoke_report(session, entry, report.passed, report.as_dict())
            records.set_status(session, entry, "ready" if report.passed else "quarantined",
                               None if report.passed else f"smoke failed: {report.failure}")
        self._release(run, "succeeded" if report.passed else "failed", entry,
                      error=report.failure)
        seconds = time.monotonic() - started
        if report.passed:
            return Outcome(run.stage, run.key, "built", run.targets, seconds=seconds,
                           digest=entry)
        return Outcome(run.stage, run.key, "smoke-failed", run.targets, seconds=seconds,
                       digest=entry, error=f"{entry} quarantined: {report.failure}")

    def _leased(self, run: StageRun) -> tuple[str, bool]:
        """Run *run* under its lease, or wait for the builder holding it and reuse its
        artifact: (digest, whether this builder built it)."""
        host = socket.gethostname()
        while True:
            with self.ctx.registry.session() as session:
                got = records.try_acquire_lease(session, run.key, owner=self.owner, host=host,
                                                pid=os.getpid(), ttl_s=LEASE_TTL_S)
            if got:
                break
            found = lookup(self.ctx, {run.key}).get(run.key)
            if found is not None:
                self.digests[run.key] = found.digest
                return found.digest, False
            if self.stop.is_set():
                raise StageError(run.stage, run.key, "stopped while waiting for another builder")
            time.sleep(POLL_S)  # another builder holds the lease: poll until it finishes
        found = None if self.force else lookup(self.ctx, {run.key}).get(run.key)
        if found is not None:  # it finished between our lookup and the lease
            self._release(run, "succeeded", found.digest)
            self.digests[run.key] = found.digest
            return found.digest, False
        renewer = _Renewer(self.ctx, run.key, self.owner)
        try:
            digest = self._build(run)
        except BaseException as exc:
            renewer.stop()
            self._release(run, "failed", None, error=str(exc)[:2000])
            raise
        renewer.stop()
        self._release(run, "succeeded", digest)
        return digest, True

    def _release(self, run: StageRun, status: Literal["succeeded", "failed"],
                 digest: str | None, error: str | None = None) -> None:
        with self.ctx.registry.session() as session:
            records.release_lease(session, run.key, owner=self.owner, status=status,
                                  artifact_digest=digest, error=error,
                                  log_location=self._publish_log(run))

    def _publish_log(self, run: StageRun) -> str | None:
        """Store the run's log as a blob; its digest is where `enginectl show` points."""
        log = self._log(run)
        if not log.is_file():
            return None
        digest = digest_file(log, with_sha256=False).xxh3
        self.ctx.store.put_blob(digest, log)
        return str(digest)

    def _log(self, run: StageRun) -> Path:
        return run.workdir / f"{run.stage}.log"

    def _input_dir(self, key: str) -> Path:
        """A local directory with the files of input *key*: this run's output, or a fetch
        from the store (through the cache, so it is free the second time)."""
        if key in self.outputs:
            return self.outputs[key]
        digest = self.digests[key]
        target = self.settings.work_dir / "inputs" / digest.removeprefix("sha256:")[:16]
        if not target.is_dir():
            fetch_manifest(self.ctx.store, load_manifest(self.ctx, digest), target,
                           cache=self.ctx.cache)
        self.outputs[key] = target
        return target

    def _build(self, run: StageRun) -> str:
        lock = None
        if run.gpu is not None:
            lock = self.gpu_locks.setdefault(run.gpu, threading.Lock())
            lock.acquire()
        try:
            job = StageJob(
                plan=self.plan, run=run, settings=self.settings,
                inputs={key: self._input_dir(key) for key in run.inputs},
                input_digests=tuple(self.digests[key] for key in run.inputs),
                log_path=self._log(run),
            )
            result = run_stage(job)
        finally:
            if lock is not None:
                lock.release()
        published = publish(
            self.ctx, result.directory, kind=run.kind, labels=result.labels,
            status="built", key=run.key, toolchain=run.toolchain,
            inputs=job.input_digests, serve=result.serve,
            recipe_digest=self.plan.loaded.digest,
        )
        self.digests[run.key] = published.digest
        self.outputs[run.key] = result.directory
        return published.digest


class _Renewer:
    """Keeps a lease alive while its stage runs (a thread renewing at a third of the TTL)."""

    def __init__(self, ctx: Context, key: str, owner: str) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(ctx, key, owner), daemon=True)
        self._thread.start()

    def _loop(self, ctx: Context, key: str, owner: str) -> None:
        while not self._done.wait(LEASE_TTL_S / 3):
            with ctx.registry.session() as session:
                records.renew_lease(session, key, owner=owner, ttl_s=LEASE_TTL_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
