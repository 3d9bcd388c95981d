"""artifacts.best_tokens_per_s and an index for resolve's one query

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

`resolve` ranks by it; reading it from the artifact row (instead of a subquery over every
smoke report's JSON) makes a resolve one indexed query. The backfill reads existing passing
reports once, in Python, so the same code serves SQLite and PostgreSQL. The index on
(model, status, kind, gpu) replaces the one on (model, status), its prefix: with it the
database skips other GPUs' engines in the index instead of reading their rows.

Frozen: this file never imports `registry.sql.models`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_artifacts = sa.table("artifacts", sa.column("id", sa.Integer()),
                      sa.column("best_tokens_per_s", sa.Float()))
_reports = sa.table("smoke_reports", sa.column("artifact_id", sa.Integer()),
                    sa.column("passed", sa.Boolean()), sa.column("report", sa.JSON()))


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("best_tokens_per_s", sa.Float(), nullable=True))
    op.create_index("ix_artifacts_model_status_kind_gpu", "artifacts",
                    ["model", "status", "kind", "gpu"])
    op.drop_index("ix_artifacts_model_status", table_name="artifacts")
    bind = op.get_bind()
    best: dict[int, float] = {}
    rows = bind.execute(sa.select(_reports.c.artifact_id, _reports.c.report)
                        .where(_reports.c.passed.is_(True)))
    for artifact_id, report in rows:
        value = _number((report or {}).get("best_output_tokens_per_s"))
        if value is not None and value > best.get(artifact_id, float("-inf")):
            best[artifact_id] = value
    for artifact_id, value in best.items():
        bind.execute(sa.update(_artifacts).where(_artifacts.c.id == artifact_id)
                     .values(best_tokens_per_s=value))


def downgrade() -> None:
    op.create_index("ix_artifacts_model_status", "artifacts", ["model", "status"])
    op.drop_index("ix_artifacts_model_status_kind_gpu", table_name="artifacts")
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("best_tokens_per_s")
