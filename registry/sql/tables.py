"""The registry's tables (DESIGN §5) as SQLAlchemy Core `Table`s: what every statement of
`registry.sql` is written against, without the ORM (a slow import that a publish, an import
and a lease renewal never need). The ORM classes of `registry.sql.models` map onto these.

The schema itself is owned by Alembic (`migrations/`); these tables must match it, and the
drift test in `tests/integration/test_registry_schema.py` keeps them honest. Only portable
types are used so one schema serves SQLite and PostgreSQL: `JSON`, `BigInteger` for byte sizes
and `UTCDateTime` (timezone-aware UTC in and out, on both dialects).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.schema import SchemaItem

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
METADATA: Final = MetaData(naming_convention=NAMING_CONVENTION)


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


def _required(name: str, kind: Any, *args: SchemaItem, **kw: Any) -> Column[Any]:
    return Column(name, kind, *args, nullable=False, **kw)


def _optional(name: str, kind: Any, *args: SchemaItem, **kw: Any) -> Column[Any]:
    return Column(name, kind, *args, nullable=True, **kw)


ARTIFACTS: Final = Table(
    "artifacts", METADATA,
    Column("id", Integer, primary_key=True),
    _required("digest", String(80), unique=True),
    _required("kind", String(40)),
    _optional("key", String(80), index=True),
    _required("model", String(200), index=True),
    _optional("runtime", String(40)),
    _optional("gpu", String(80)),
    _optional("sm", Integer),
    _optional("quant", String(40)),
    _optional("kv_cache_dtype", String(40)),
    _required("tp", Integer, default=1),
    _required("pp", Integer, default=1),
    _optional("max_batch_size", Integer),
    _optional("max_input_len", Integer),
    _optional("max_seq_len", Integer),
    _optional("max_num_tokens", Integer),
    _required("toolchain", JSON),
    _required("labels", JSON),
    _required("size", BigInteger),
    _required("file_count", Integer),
    _required("status", String(20)),
    _optional("status_reason", Text),
    _optional("recipe_digest", String(80)),
    # the best `best_output_tokens_per_s` of the passing smoke reports (migration 0002),
    # kept by `smoke_records.add_smoke_report` so that resolve reads no report
    _optional("best_tokens_per_s", Float),
    _required("created_at", UTCDateTime(), default=utcnow),
    _required("updated_at", UTCDateTime(), default=utcnow, onupdate=utcnow),
    CheckConstraint(_one_of("status", ARTIFACT_STATUSES), name="status"),
    # resolve: a model's ready artifacts of the servable kinds, engines for one GPU, and
    # the columns it ranks them by, so that it reads the index alone (migration 0004)
    Index("ix_artifacts_resolve", "model", "status", "kind", "gpu", "created_at", "digest",
          "quant", "kv_cache_dtype", "tp", "max_batch_size", "max_seq_len", "pp"),
    Index("ix_artifacts_gpu_status", "gpu", "status"),
)

ARTIFACT_FILES: Final = Table(
    "artifact_files", METADATA,
    Column("artifact_id", Integer, ForeignKey("artifacts.id", ondelete="CASCADE"),
           primary_key=True),
    Column("path", String(1024), primary_key=True),
    _required("size", BigInteger),
    _required("xxh3", String(80)),
    _required("sha256", String(80)),
)

STAGE_RUNS: Final = Table(
    "stage_runs", METADATA,
    Column("key", String(80), primary_key=True),
    _required("status", String(20)),
    _required("host", String(255)),
    _required("pid", Integer),
    _required("owner", String(100)),
    _required("started_at", UTCDateTime()),
    _optional("finished_at", UTCDateTime()),
    _required("lease_expires_at", UTCDateTime()),
    _optional("artifact_digest", String(80)),
    _optional("log_location", Text),
    _optional("error", Text),
    _optional("node_id", String(100)),  # the Ray node that ran it (None off Ray)
    CheckConstraint(_one_of("status", RUN_STATUSES), name="status"),
)
"""One row per stage key: the lease a builder holds while it runs, then the outcome."""

SMOKE_REPORTS: Final = Table(
    "smoke_reports", METADATA,
    Column("id", Integer, primary_key=True),
    _required("artifact_id", Integer, ForeignKey("artifacts.id", ondelete="CASCADE")),
    _required("passed", Boolean),
    _required("report", JSON),
    _required("created_at", UTCDateTime(), default=utcnow),
    _optional("gpu", String(80)),  # a catalog SKU or "CPU"; None for reports before 0003
    _optional("toolchain", JSON),  # the fingerprint it ran with (None: unknown)
    _optional("key", String(80)),  # the smoke stage key (None for `enginectl smoke`)
    # resolve: its candidates' reports on the node's SKU (migration 0004)
    Index("ix_smoke_reports_artifact_id_gpu", "artifact_id", "gpu"),
)

ARTIFACT_EVIDENCE: Final = Table(
    "artifact_evidence", METADATA,
    Column("artifact_id", Integer, ForeignKey("artifacts.id", ondelete="CASCADE"),
           primary_key=True),
    Column("gpu", String(80), primary_key=True),
    _optional("best_tokens_per_s", Float),
    _required("passed_at", UTCDateTime()),
)
"""Per artifact and GPU SKU, the best passing smoke throughput measured there (kept by
`smoke_records.add_smoke_report`), so that resolve ranks by the node's own SKU in one join."""

ALIASES: Final = Table(
    "aliases", METADATA,
    Column("name", String(255), primary_key=True),
    _required("digest", String(80), ForeignKey("artifacts.digest"), index=True),
    _required("updated_at", UTCDateTime(), default=utcnow, onupdate=utcnow),
)

ALIAS_EVENTS: Final = Table(
    "alias_events", METADATA,
    Column("id", Integer, primary_key=True),
    _required("name", String(255), index=True),
    _optional("digest", String(80)),
    _optional("previous_digest", String(80)),
    _required("at", UTCDateTime(), default=utcnow),
    _optional("note", Text),
    _optional("details", JSON),  # what a promotion compared, if any
)
"""Every move of an alias, kept forever; `digest` is NULL when the alias was removed."""

TOOLCHAINS: Final = Table(
    "toolchains", METADATA,
    Column("id", Integer, primary_key=True),
    _required("pool", String(255), index=True),
    _required("gpu", String(80)),
    _required("fingerprint", JSON),
    _required("host", String(255)),
    _required("probed_at", UTCDateTime(), default=utcnow),
    _optional("node_id", String(100)),
)
"""A toolchain fingerprint probed on one GPU pool at one time."""

RECIPES: Final = Table(
    "recipes", METADATA,
    Column("digest", String(80), primary_key=True),
    _required("name", String(255)),
    _required("text", Text),
    _required("created_at", UTCDateTime(), default=utcnow),
    _optional("path", Text),  # where the recipe was read (its local sources are relative to it)
    _optional("last_used_at", UTCDateTime()),
)

PENDING_PUBLISHES: Final = Table(
    "pending_publishes", METADATA,
    Column("id", String(40), primary_key=True),
    _required("owner", String(100)),
    _required("started_at", UTCDateTime()),
    _required("expires_at", UTCDateTime()),
    _required("blobs", JSON),
)
"""A publish in progress and the blobs it relies on: gc keeps them until it ends or
`expires_at` passes (a publisher killed mid-way)."""

NIGHTLY_RUNS: Final = Table(
    "nightly_runs", METADATA,
    Column("id", Integer, primary_key=True),
    _required("owner", String(100)),
    _required("host", String(255)),
    _required("started_at", UTCDateTime(), index=True),
    _optional("finished_at", UTCDateTime()),
    _required("status", String(20)),
    _optional("exit_code", Integer),
    _optional("report", JSON),
)
"""One `enginectl nightly`: who ran it, how it ended, and its report."""
