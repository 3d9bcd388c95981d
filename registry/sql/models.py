"""The registry's tables (DESIGN §5) as SQLAlchemy 2.0 declarative models.

The schema itself is owned by Alembic (`migrations/`); these classes must match it, and the
drift test in `tests/integration/test_registry_schema.py` keeps them honest. Only portable types
are used so one schema serves SQLite and PostgreSQL: `JSON`, `BigInteger` for byte sizes and
`UTCDateTime` (timezone-aware UTC in and out, on both dialects).

The ORM classes stay inside the `registry` package: callers go through `registry.sql.records`,
which speaks plain dataclasses.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from registry.identity.manifest import KINDS
from registry.sql.statuses import ARTIFACT_STATUSES as _ARTIFACT_STATUSES
from registry.sql.statuses import RUN_STATUSES

ARTIFACT_KINDS: Final = tuple(KINDS)
ARTIFACT_STATUSES: Final = _ARTIFACT_STATUSES  # where records and history import it from

NAMING_CONVENTION: Final = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that refuses naive values and always returns aware UTC.

    SQLite keeps no offset, so values are normalised to UTC before they are written; that
    also keeps SQLite's text comparison of timestamps (lease expiry) correct.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    # The dialect argument is part of TypeDecorator's signature; UTC handling ignores it.
    def process_bind_param(
        self, value: datetime | None, dialect: Dialect  # noqa: ARG002
    ) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}; the registry stores aware UTC times")
        return value.astimezone(UTC)

    def process_result_value(
        self, value: datetime | None, dialect: Dialect  # noqa: ARG002
    ) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (
        CheckConstraint(_one_of("status", ARTIFACT_STATUSES), name="status"),
        # resolve: a model's ready artifacts of the servable kinds, engines for one GPU, and
        # the columns it ranks them by, so that it reads the index alone (migration 0004)
        Index("ix_artifacts_resolve", "model", "status", "kind", "gpu", "created_at", "digest",
              "quant", "kv_cache_dtype", "tp", "max_batch_size", "max_seq_len", "pp"),
        Index("ix_artifacts_gpu_status", "gpu", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), unique=True)
    kind: Mapped[str] = mapped_column(String(40))
    key: Mapped[str | None] = mapped_column(String(80), index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    runtime: Mapped[str | None] = mapped_column(String(40))
    gpu: Mapped[str | None] = mapped_column(String(80))
    sm: Mapped[int | None] = mapped_column(Integer)
    quant: Mapped[str | None] = mapped_column(String(40))
    kv_cache_dtype: Mapped[str | None] = mapped_column(String(40))
    tp: Mapped[int] = mapped_column(Integer, default=1)
    pp: Mapped[int] = mapped_column(Integer, default=1)
    max_batch_size: Mapped[int | None] = mapped_column(Integer)
    max_input_len: Mapped[int | None] = mapped_column(Integer)
    max_seq_len: Mapped[int | None] = mapped_column(Integer)
    max_num_tokens: Mapped[int | None] = mapped_column(Integer)
    toolchain: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    size: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))
    status_reason: Mapped[str | None] = mapped_column(Text)
    recipe_digest: Mapped[str | None] = mapped_column(String(80))
    best_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    """The best `best_output_tokens_per_s` of the passing smoke reports (migration 0002),
    kept by `smoke_records.add_smoke_report` so that resolve reads no report."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class ArtifactFile(Base):
    __tablename__ = "artifact_files"

    artifact_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    xxh3: Mapped[str] = mapped_column(String(80))
    sha256: Mapped[str] = mapped_column(String(80))


class StageRunRow(Base):
    """One row per stage key: the lease a builder holds while it runs, then the outcome."""

    __tablename__ = "stage_runs"
    __table_args__ = (CheckConstraint(_one_of("status", RUN_STATUSES), name="status"),)

    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    status: Mapped[str] = mapped_column(String(20))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    artifact_digest: Mapped[str | None] = mapped_column(String(80))
    log_location: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    node_id: Mapped[str | None] = mapped_column(String(100))
    """The Ray node that ran it (None on the local executor); `host` is its hostname."""


class SmokeReportRow(Base):
    __tablename__ = "smoke_reports"
    # resolve: its candidates' reports on the node's SKU (migration 0004)
    __table_args__ = (Index("ix_smoke_reports_artifact_id_gpu", "artifact_id", "gpu"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("artifacts.id", ondelete="CASCADE")
    )
    passed: Mapped[bool] = mapped_column(Boolean)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    gpu: Mapped[str | None] = mapped_column(String(80))
    """Where it was measured: a catalog SKU or "CPU"; None for reports from before 0003."""
    toolchain: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The fingerprint it ran with (None: unknown)."""
    key: Mapped[str | None] = mapped_column(String(80))
    """The smoke stage key that produced it (None for `enginectl smoke` and old reports)."""


class ArtifactEvidence(Base):
    """Per artifact and GPU SKU, the best passing smoke throughput measured there (kept by
    `smoke_records.add_smoke_report`), so that resolve ranks by the node's own SKU in one join."""

    __tablename__ = "artifact_evidence"

    artifact_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True
    )
    gpu: Mapped[str] = mapped_column(String(80), primary_key=True)
    best_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    passed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Alias(Base):
    __tablename__ = "aliases"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), ForeignKey("artifacts.digest"), index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class AliasEventRow(Base):
    """Every move of an alias, kept forever; `digest` is NULL when the alias was removed."""

    __tablename__ = "alias_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    digest: Mapped[str | None] = mapped_column(String(80))
    previous_digest: Mapped[str | None] = mapped_column(String(80))
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    note: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """What a promotion compared (old and new throughput per concurrency level), if any."""


class ToolchainRow(Base):
    """A toolchain fingerprint probed on one GPU pool at one time."""

    __tablename__ = "toolchains"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool: Mapped[str] = mapped_column(String(255), index=True)
    gpu: Mapped[str] = mapped_column(String(80))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str] = mapped_column(String(255))
    probed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    node_id: Mapped[str | None] = mapped_column(String(100))


class Recipe(Base):
    __tablename__ = "recipes"

    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    path: Mapped[str | None] = mapped_column(Text)
    """Where the recipe was read (its local sources are relative to it)."""
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class PendingPublish(Base):
    """A publish in progress and the blobs it relies on: gc keeps them until it ends or
    `expires_at` passes (a publisher killed mid-way)."""

    __tablename__ = "pending_publishes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    blobs: Mapped[list[str]] = mapped_column(JSON)


class NightlyRun(Base):
    """One `enginectl nightly`: who ran it, how it ended, and its report."""

    __tablename__ = "nightly_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(100))
    host: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(20))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
