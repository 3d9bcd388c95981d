"""view: a build as a person follows it — a line or a live table row per stage run as the
walk goes, and the summary at the end (`enginectl build`, local or on Ray).

    describe          one line per finished run on this machine
    on_node           the same line with the node that ran it (a build on Ray)
    LiveView          the live table on a terminal (NodeView: with the node)
    walk_and_report   the walk (`pipeline.executors.dag.walk`) reported through one of those
    summary_lines, dry_run_lines   what the CLI prints after a build or a dry run
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.executors.result import BuildResult
from pipeline.listings import plan_lines
from pipeline.planning.keys import short_key
from pipeline.planning.outcome import BuildSummary, Outcome
from registry.context import Context
from registry.progress import Echo

if TYPE_CHECKING:  # the plan: a no-op build says what it reused without the recipe's model
    from pipeline.executors.dag import Backend
    from pipeline.planning.plan import Plan
    from pipeline.planning.stage_run import StageRun
    from pipeline.serving.promote import Promotion
    from registry.sql.records import ArtifactRecord


def _where(outcome: Outcome) -> tuple[str, str]:
    """The run's first target (and how many more), and its time when it was built."""
    where = outcome.targets[0] + (f" (+{len(outcome.targets) - 1})" if len(outcome.targets) > 1
                                  else "")
    timing = f" {outcome.seconds:.1f}s" if outcome.status == "built" else ""
    return where, timing


def describe(outcome: Outcome) -> str:
    """One line per finished stage run."""
    mark = {"built": "built  ", "reused": "reused ", "failed": "FAILED ", "skipped": "skipped",
            "pending-smoke": "smoke? ", "waiting": "waiting",
            "smoke-failed": "SMOKE! ", "cancelled": "stopped"}[outcome.status]
    where, timing = _where(outcome)
    return f"{mark} {outcome.stage:<8} {short_key(outcome.key)}  {where}{timing}"


def on_node(outcome: Outcome) -> str:
    """One line per finished stage run, with the node that ran it."""
    where, timing = _where(outcome)
    node = ""
    if outcome.node:
        node = f"  on {outcome.node['host']} {outcome.node['node_id'][:12]}"
    why = f": {outcome.error}" if outcome.status in ("failed", "cancelled") else ""
    return (f"{outcome.status:<13} {outcome.stage:<8} {short_key(outcome.key)}  "
            f"{where}{timing}{node}{why}")


def walk_and_report(plan: Plan, ctx: Context, keys: set[str], backend: Backend, *,
               hits: Mapping[str, ArtifactRecord], keep_going: bool, echo: Echo | None,
               live: bool | None, view: type[LiveView] | None = None,
               line: Callable[[Outcome], str] = describe) -> BuildSummary:
    """The walk (`pipeline.executors.dag.walk`) shown as it goes: a live *view* table (default
    `LiveView`) when *live* (default: stdout is a terminal), else a *line* (default
    `describe`) per finished run to *echo*; silent without *echo*."""
    from pipeline.executors.dag import walk

    if echo is not None and (sys.stdout.isatty() if live is None else live):
        with (view or LiveView)(plan, keys) as table:
            return walk(plan, ctx, keys, backend, hits=hits, keep_going=keep_going,
                        report=table.finished, started=table.started)
    report = (lambda outcome: echo(line(outcome))) if echo else None
    return walk(plan, ctx, keys, backend, hits=hits, keep_going=keep_going, report=report)


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


class NodeView(LiveView):
    """The local build's live table, each finished run with the node that ran it."""

    def finished(self, outcome: Outcome) -> None:
        super().finished(outcome)
        if outcome.node:
            with self.lock:
                self.state[outcome.key] += (f" on {outcome.node['host']} "
                                            f"{outcome.node['node_id'][:8]}")
                self.live.update(self._table())


def dry_run_lines(result: BuildResult) -> list[str]:
    return plan_lines(result.plan, built=frozenset(result.hits))


def summary_lines(summary: BuildSummary, promotions: Sequence[Promotion] = ()) -> list[str]:
    """What the CLI prints after a build: the counts, each run built, each awaiting a smoke
    or failed, and the aliases *promotions* moved."""
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
    for promotion in promotions:
        lines.append(f"promoted {promotion.alias} -> {promotion.new} ({promotion.reason})")
    return lines
