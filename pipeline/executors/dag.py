"""The plan's DAG walked in dependency order; each executor only says where a run executes.

For each stage run, in an order where inputs come first:

  hit      the registry maps its key to an artifact that is not deleted or quarantined: reuse
  skip     an input failed (or the build was stopped): nothing runs
  submit   its inputs are done and the backend has room: hand it to the backend, which runs
           it (see `pipeline.executors.stage`) and answers with its Outcome

A failure stops the walk unless `keep_going`. Ctrl-C stops the backend (every child it
started; the runs in flight end `cancelled`), collects their outcomes and returns the summary
marked `interrupted`: what finished is published and kept, and a re-run resumes from it. Any
other exception stops the backend the same way before it propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Protocol

from pipeline.executors.stage import reused
from pipeline.planning.outcome import BuildSummary, Outcome
from pipeline.planning.plan import Plan
from pipeline.planning.stage_run import StageRun
from registry.context import Context
from registry.sql import leases, records

Reporter = Callable[[Outcome], None]
Starter = Callable[[StageRun], None]


class Backend(Protocol):
    """Where stage runs execute: this machine's threads, or tasks on a Ray cluster."""

    capacity: int
    """How many stage runs it takes at once."""

    def submit(self, run: StageRun, digests: Mapping[str, str]) -> Future[Outcome]:
        """Start *run*, whose inputs' artifacts are *digests* (input key -> digest)."""

    def wind_down(self) -> None:
        """Start nothing new: runs waiting for another builder's lease give up (a failure
        without keep-going)."""

    def stop(self) -> None:
        """Stop every run in flight now (Ctrl-C): their children are stopped, their leases
        released, and nothing half-done is published."""


def walk(plan: Plan, ctx: Context, keys: set[str], backend: Backend, *,
         hits: Mapping[str, records.ArtifactRecord], keep_going: bool = False,
         report: Reporter | None = None, started: Starter | None = None) -> BuildSummary:
    """Run the stage runs of *plan* among *keys*, reusing *hits*, on *backend*."""
    walker = _Walk(plan, ctx, backend, hits=hits, keep_going=keep_going,
                   report=report or (lambda _outcome: None),
                   started=started or (lambda _run: None))
    try:
        walker.run(keys)
    except KeyboardInterrupt:
        backend.stop()
        walker.drain()
    except BaseException:
        backend.stop()
        raise
    return walker.summary


class _Walk:
    def __init__(self, plan: Plan, ctx: Context, backend: Backend, *,
                 hits: Mapping[str, records.ArtifactRecord], keep_going: bool,
                 report: Reporter, started: Starter) -> None:
        self.plan, self.ctx, self.backend = plan, ctx, backend
        self.hits, self.keep_going = hits, keep_going
        self.report, self.started = report, started
        self.summary = BuildSummary()
        self.previous: dict[str, leases.StageRunRecord] = {}
        self.digests: dict[str, str] = {}  # key -> artifact digest, as runs finish
        self.running: dict[Future[Outcome], str] = {}
        self.done: set[str] = set()
        self.blocked: set[str] = set()
        self.stopping = False
        self.wanted: set[str] = set()

    def finish(self, outcome: Outcome) -> None:
        self.summary.outcomes.append(outcome)
        self.report(outcome)

    def run(self, keys: set[str]) -> None:
        self.wanted = keys
        if self.hits:
            with self.ctx.registry.session(readonly=True) as session:
                self.previous = leases.get_stage_runs(session, set(self.hits))
        pending = dict.fromkeys(key for key in self.plan.stages if key in keys)
        while pending or self.running:
            for key in list(pending):
                if self.schedule(key):
                    pending.pop(key)
            if not self.running:
                if pending and self.stopping:
                    for key in pending:
                        run = self.plan.stages[key]
                        self.finish(Outcome(run.stage, key, "skipped", run.targets,
                                            error="stopped"))
                    pending.clear()
                continue
            finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
            for future in finished:
                self.collect(self.running.pop(future), future.result())

    def drain(self) -> None:
        """After Ctrl-C: collect the runs in flight (the backend has stopped them) and mark
        the rest as never started."""
        self.summary.interrupted = True
        self.stopping = True
        for future, key in list(self.running.items()):
            run = self.plan.stages[key]
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - a run that broke while being stopped
                outcome = Outcome(run.stage, key, "cancelled", run.targets, error=str(exc))
            self.collect(key, outcome)
        self.running.clear()
        finished = {o.key for o in self.summary.outcomes}
        for key, run in self.plan.stages.items():
            if key in self.wanted and key not in finished:
                self.finish(Outcome(run.stage, key, "skipped", run.targets, error="stopped"))

    def schedule(self, key: str) -> bool:
        """Settle or start *key* if it can be now; False when it must wait."""
        run = self.plan.stages[key]
        if any(i in self.blocked for i in run.inputs):
            self.blocked.add(key)
            self.finish(Outcome(run.stage, key, "skipped", run.targets, error="an input failed"))
            return True
        if key in self.hits:
            self.done.add(key)
            self.digests[key] = self.hits[key].digest
            self.finish(reused(self.ctx, run, self.hits[key], self.previous.get(key)))
            return True
        if self.stopping or len(self.running) >= self.backend.capacity \
                or not all(i in self.done for i in run.inputs):
            return False
        self.started(run)
        future = self.backend.submit(run, {i: self.digests[i] for i in run.inputs})
        self.running[future] = key
        return True

    def collect(self, key: str, outcome: Outcome) -> None:
        self.finish(outcome)
        if outcome.status in ("failed", "cancelled"):
            self.blocked.add(key)
            if not self.keep_going:
                self.stopping = True
                self.backend.wind_down()
        else:
            self.done.add(key)
            if outcome.digest is not None:
                self.digests[key] = outcome.digest
