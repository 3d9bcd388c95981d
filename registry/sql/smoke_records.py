"""Smoke reports in SQL: the evidence that an artifact serves, where it was measured, and
the best throughput per artifact and per GPU that resolve ranks by. The store half (and the
one call that writes both) is `registry.ops.history`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, insert, or_, select, update

from registry.sql.rows import artifact_id as row_id
from registry.sql.rows import insert_for
from registry.sql.tables import ARTIFACT_EVIDENCE, ARTIFACTS, SMOKE_REPORTS, utcnow

if TYPE_CHECKING:
    from registry.sql.rows import Executor


@dataclass(frozen=True, slots=True)
class SmokeRecord:
    digest: str
    passed: bool
    report: dict[str, Any]
    created_at: datetime
    gpu: str | None = None
    """Where it ran: a catalog SKU or "CPU"; None for reports from before schema 0003."""
    toolchain: dict[str, Any] | None = None
    key: str | None = None
    """The smoke stage key that produced it (None for `enginectl smoke` and old reports)."""


def add_smoke_report(
    session: Executor, digest: str, passed: bool, report: dict[str, Any], *,
    gpu: str | None = None, toolchain: dict[str, Any] | None = None, key: str | None = None,
    created_at: datetime | None = None,
) -> None:
    """Attach a smoke report to *digest* (its status is the caller's to move), measured on
    *gpu* (a catalog SKU or "CPU"; None: unknown) with *toolchain*, by the smoke run *key*,
    as of *created_at* (now; `reindex` gives the recorded time).

    A passing report's throughput raises the artifact's `best_tokens_per_s`, and, when *gpu*
    is known, the artifact's evidence on that GPU (`artifact_evidence`), which resolve ranks
    by: a report from elsewhere proves nothing about the node's own SKU."""
    artifact_id = row_id(session, digest)[0]
    now = created_at or utcnow()
    session.execute(
        insert(SMOKE_REPORTS).values(
            artifact_id=artifact_id, passed=passed, report=report, created_at=now,
            gpu=gpu, toolchain=toolchain, key=key,
        )
    )
    if not passed:
        return
    found = report.get("best_output_tokens_per_s")
    best = float(found) if isinstance(found, int | float) and not isinstance(found, bool) \
        else None
    if best is not None:
        # One conditional UPDATE: concurrent reports can only raise the value.
        column = ARTIFACTS.c.best_tokens_per_s
        session.execute(
            update(ARTIFACTS)
            .where(ARTIFACTS.c.id == artifact_id, or_(column.is_(None), column < best))
            .values(best_tokens_per_s=best)
        )
    if gpu is not None:
        _raise_evidence(session, artifact_id, gpu, best, now)


def _raise_evidence(
    session: Executor, artifact_id: int, gpu: str, best: float | None, now: datetime
) -> None:
    """Upsert the (artifact, gpu) evidence row: one atomic statement, so concurrent reports
    can only raise the best throughput; `passed_at` is the latest pass."""
    table = ARTIFACT_EVIDENCE
    stmt = insert_for(session, ARTIFACT_EVIDENCE).values(
        artifact_id=artifact_id, gpu=gpu, best_tokens_per_s=best, passed_at=now)
    current, offered = table.c.best_tokens_per_s, stmt.excluded.best_tokens_per_s
    stmt = stmt.on_conflict_do_update(
        index_elements=["artifact_id", "gpu"],
        set_={
            "best_tokens_per_s": case(
                (or_(current.is_(None), current < offered), offered), else_=current),
            "passed_at": stmt.excluded.passed_at,
        },
    )
    session.execute(stmt)


def smoke_reports(session: Executor, digest: str) -> list[SmokeRecord]:
    """Smoke reports of *digest*, oldest first, each with where it ran."""
    query = (
        select(SMOKE_REPORTS.c.passed, SMOKE_REPORTS.c.report, SMOKE_REPORTS.c.created_at,
               SMOKE_REPORTS.c.gpu, SMOKE_REPORTS.c.toolchain, SMOKE_REPORTS.c.key)
        .where(SMOKE_REPORTS.c.artifact_id == row_id(session, digest)[0])
        .order_by(SMOKE_REPORTS.c.created_at, SMOKE_REPORTS.c.id)
    )
    return [SmokeRecord(digest, *row) for row in session.execute(query)]
