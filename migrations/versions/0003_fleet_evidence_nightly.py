"""cancelled runs, where runs and probes ran, evidence per GPU, pending publishes, nightly runs

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- `stage_runs.status` may be `cancelled` (Ctrl-C, a timeout enforced by the driver), and
  `stage_runs.node_id` records the Ray node that ran it (`host` is its hostname).
- `toolchains.node_id`: the node a pool's probe ran on.
- `smoke_reports.gpu` (a catalog SKU or `CPU`), `.toolchain` (the fingerprint it ran with)
  and `.key` (the smoke stage key): evidence says where it was measured. Old reports keep
  NULLs, which read as "unknown".
- `artifact_evidence`: per artifact and GPU, the best passing throughput, so that resolve
  ranks by evidence from the node's own SKU in one indexed join.
- `alias_events.details`: what a promotion compared (old and new throughput).
- `recipes.path` and `.last_used_at`: where a recipe was read and when it was last built, so
  a nightly without arguments knows every recipe at its latest content.
- `pending_publishes`: the blobs a publish in progress relies on; gc keeps them.
- `nightly_runs`: one row per nightly, with its report.

Frozen: this file never imports `registry.sql.models`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_RUN_STATUSES = ("running", "succeeded", "failed")
RUN_STATUSES = ("running", "succeeded", "failed", "cancelled")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("stage_runs") as batch:
        batch.drop_constraint("ck_stage_runs_status", type_="check")
        batch.create_check_constraint("ck_stage_runs_status", _one_of("status", RUN_STATUSES))
        batch.add_column(sa.Column("node_id", sa.String(length=100), nullable=True))
    with op.batch_alter_table("toolchains") as batch:
        batch.add_column(sa.Column("node_id", sa.String(length=100), nullable=True))
    with op.batch_alter_table("smoke_reports") as batch:
        batch.add_column(sa.Column("gpu", sa.String(length=80), nullable=True))
        batch.add_column(sa.Column("toolchain", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("key", sa.String(length=80), nullable=True))
    with op.batch_alter_table("alias_events") as batch:
        batch.add_column(sa.Column("details", sa.JSON(), nullable=True))
    with op.batch_alter_table("recipes") as batch:
        batch.add_column(sa.Column("path", sa.Text(), nullable=True))
        batch.add_column(sa.Column("last_used_at", _utc(), nullable=True))

    op.create_table(
        "artifact_evidence",
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.String(length=80), nullable=False),
        sa.Column("best_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("passed_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name="fk_artifact_evidence_artifact_id_artifacts", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", "gpu", name="pk_artifact_evidence"),
    )
    op.create_table(
        "pending_publishes",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("expires_at", _utc(), nullable=False),
        sa.Column("blobs", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pending_publishes"),
    )
    op.create_table(
        "nightly_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("finished_at", _utc(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_nightly_runs"),
    )
    op.create_index("ix_nightly_runs_started_at", "nightly_runs", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_nightly_runs_started_at", table_name="nightly_runs")
    for table in ("nightly_runs", "pending_publishes", "artifact_evidence"):
        op.drop_table(table)
    with op.batch_alter_table("recipes") as batch:
        batch.drop_column("last_used_at")
        batch.drop_column("path")
    with op.batch_alter_table("alias_events") as batch:
        batch.drop_column("details")
    with op.batch_alter_table("smoke_reports") as batch:
        batch.drop_column("key")
        batch.drop_column("toolchain")
        batch.drop_column("gpu")
    with op.batch_alter_table("toolchains") as batch:
        batch.drop_column("node_id")
    with op.batch_alter_table("stage_runs") as batch:
        batch.drop_column("node_id")
        batch.drop_constraint("ck_stage_runs_status", type_="check")
        batch.create_check_constraint("ck_stage_runs_status",
                                      _one_of("status", OLD_RUN_STATUSES))
