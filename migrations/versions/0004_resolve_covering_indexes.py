"""indexes that hold what resolve reads, so a resolve reads no scattered rows

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06

At a million artifacts a model's ~500 rows lie on ~500 different pages, and resolve read
each of its ~90 candidates' rows for a dozen small columns. `ix_artifacts_resolve` holds
them, after the (model, status, kind, gpu) prefix of the index it replaces: the candidates
of a request are a few adjacent index pages (an index-only read on SQLite, and on
PostgreSQL once vacuum has marked the pages visible). Only an engine for the node's own SKU
still reads its row, for the toolchain it was built with (JSON, which no index holds).
`ix_smoke_reports_artifact_id_gpu` replaces the index on `artifact_id` alone: each
candidate's proofs on the node's SKU without reading its reports from other GPUs.

Frozen: this file never imports `registry.sql.models`.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESOLVE_COLUMNS = ["model", "status", "kind", "gpu", "created_at", "digest", "quant",
                   "kv_cache_dtype", "tp", "max_batch_size", "max_seq_len", "pp"]


def upgrade() -> None:
    op.create_index("ix_artifacts_resolve", "artifacts", RESOLVE_COLUMNS)
    op.drop_index("ix_artifacts_model_status_kind_gpu", table_name="artifacts")
    op.create_index("ix_smoke_reports_artifact_id_gpu", "smoke_reports", ["artifact_id", "gpu"])
    op.drop_index("ix_smoke_reports_artifact_id", table_name="smoke_reports")


def downgrade() -> None:
    op.create_index("ix_smoke_reports_artifact_id", "smoke_reports", ["artifact_id"])
    op.drop_index("ix_smoke_reports_artifact_id_gpu", table_name="smoke_reports")
    op.create_index("ix_artifacts_model_status_kind_gpu", "artifacts",
                    ["model", "status", "kind", "gpu"])
    op.drop_index("ix_artifacts_resolve", table_name="artifacts")
