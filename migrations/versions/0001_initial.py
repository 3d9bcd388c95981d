"""initial registry schema (DESIGN §5)

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Frozen: this file never imports `registry.sql.models`; later changes get their own revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ARTIFACT_STATUSES = ("building", "built", "ready", "quarantined", "superseded", "deleted")
RUN_STATUSES = ("running", "succeeded", "failed")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=80), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("runtime", sa.String(length=40), nullable=True),
        sa.Column("gpu", sa.String(length=80), nullable=True),
        sa.Column("sm", sa.Integer(), nullable=True),
        sa.Column("quant", sa.String(length=40), nullable=True),
        sa.Column("kv_cache_dtype", sa.String(length=40), nullable=True),
        sa.Column("tp", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=True),
        sa.Column("max_input_len", sa.Integer(), nullable=True),
        sa.Column("max_seq_len", sa.Integer(), nullable=True),
        sa.Column("max_num_tokens", sa.Integer(), nullable=True),
        sa.Column("toolchain", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("recipe_digest", sa.String(length=80), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.CheckConstraint(_one_of("status", ARTIFACT_STATUSES), name="ck_artifacts_status"),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.UniqueConstraint("digest", name="uq_artifacts_digest"),
    )
    op.create_index("ix_artifacts_key", "artifacts", ["key"])
    op.create_index("ix_artifacts_model", "artifacts", ["model"])
    op.create_index("ix_artifacts_model_status", "artifacts", ["model", "status"])
    op.create_index("ix_artifacts_gpu_status", "artifacts", ["gpu", "status"])

    op.create_table(
        "artifact_files",
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("xxh3", sa.String(length=80), nullable=False),
        sa.Column("sha256", sa.String(length=80), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name="fk_artifact_files_artifact_id_artifacts", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", "path", name="pk_artifact_files"),
    )

    op.create_table(
        "stage_runs",
        sa.Column("key", sa.String(length=80), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("finished_at", _utc(), nullable=True),
        sa.Column("lease_expires_at", _utc(), nullable=False),
        sa.Column("artifact_digest", sa.String(length=80), nullable=True),
        sa.Column("log_location", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(_one_of("status", RUN_STATUSES), name="ck_stage_runs_status"),
        sa.PrimaryKeyConstraint("key", name="pk_stage_runs"),
    )

    op.create_table(
        "smoke_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name="fk_smoke_reports_artifact_id_artifacts", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_smoke_reports"),
    )
    op.create_index("ix_smoke_reports_artifact_id", "smoke_reports", ["artifact_id"])

    op.create_table(
        "aliases",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"], ["artifacts.digest"], name="fk_aliases_digest_artifacts"
        ),
        sa.PrimaryKeyConstraint("name", name="pk_aliases"),
    )
    op.create_index("ix_aliases_digest", "aliases", ["digest"])

    op.create_table(
        "alias_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=True),
        sa.Column("previous_digest", sa.String(length=80), nullable=True),
        sa.Column("at", _utc(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alias_events"),
    )
    op.create_index("ix_alias_events_name", "alias_events", ["name"])

    op.create_table(
        "toolchains",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("gpu", sa.String(length=80), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("probed_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_toolchains"),
    )
    op.create_index("ix_toolchains_pool", "toolchains", ["pool"])

    op.create_table(
        "recipes",
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_recipes"),
    )


def downgrade() -> None:
    for table in (
        "recipes", "toolchains", "alias_events", "aliases", "smoke_reports", "stage_runs",
        "artifact_files", "artifacts",
    ):
        op.drop_table(table)
