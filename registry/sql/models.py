"""The registry's tables (`registry.sql.tables`) as SQLAlchemy 2.0 declarative classes, for
what still wants the ORM (Alembic's autogenerate and drift check, and mapped reads).

The tables are Core (`registry.sql.tables`), where every statement of `registry.sql` is
written; each class here maps onto one of them, so there is one definition of the schema. The
schema itself is owned by Alembic (`migrations/`). The ORM classes stay inside the `registry`
package: callers go through `registry.sql.records`, which speaks plain dataclasses.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import FromClause
from sqlalchemy.orm import DeclarativeBase, Mapped

from registry.sql import tables
from registry.sql.tables import (
    ARTIFACT_KINDS,
    ARTIFACT_STATUSES,
    NAMING_CONVENTION,
    UTCDateTime,
    utcnow,
)

__all__ = [
    "ARTIFACT_KINDS", "ARTIFACT_STATUSES", "NAMING_CONVENTION", "Alias", "AliasEventRow",
    "Artifact", "ArtifactEvidence", "ArtifactFile", "Base", "NightlyRun", "PendingPublish",
    "Recipe", "SmokeReportRow", "StageRunRow", "ToolchainRow", "UTCDateTime", "utcnow",
]


class Base(DeclarativeBase):
    metadata = tables.METADATA


class Artifact(Base):
    __table__: ClassVar[FromClause] = tables.ARTIFACTS

    id: Mapped[int]
    digest: Mapped[str]
    kind: Mapped[str]
    key: Mapped[str | None]
    model: Mapped[str]
    runtime: Mapped[str | None]
    gpu: Mapped[str | None]
    sm: Mapped[int | None]
    quant: Mapped[str | None]
    kv_cache_dtype: Mapped[str | None]
    tp: Mapped[int]
    pp: Mapped[int]
    max_batch_size: Mapped[int | None]
    max_input_len: Mapped[int | None]
    max_seq_len: Mapped[int | None]
    max_num_tokens: Mapped[int | None]
    toolchain: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, Any]]
    size: Mapped[int]
    file_count: Mapped[int]
    status: Mapped[str]
    status_reason: Mapped[str | None]
    recipe_digest: Mapped[str | None]
    best_tokens_per_s: Mapped[float | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class ArtifactFile(Base):
    __table__: ClassVar[FromClause] = tables.ARTIFACT_FILES

    artifact_id: Mapped[int]
    path: Mapped[str]
    size: Mapped[int]
    xxh3: Mapped[str]
    sha256: Mapped[str]


class StageRunRow(Base):
    """One row per stage key: the lease a builder holds while it runs, then the outcome."""

    __table__: ClassVar[FromClause] = tables.STAGE_RUNS

    key: Mapped[str]
    status: Mapped[str]
    host: Mapped[str]
    pid: Mapped[int]
    owner: Mapped[str]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime]
    artifact_digest: Mapped[str | None]
    log_location: Mapped[str | None]
    error: Mapped[str | None]
    node_id: Mapped[str | None]


class SmokeReportRow(Base):
    __table__: ClassVar[FromClause] = tables.SMOKE_REPORTS

    id: Mapped[int]
    artifact_id: Mapped[int]
    passed: Mapped[bool]
    report: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    gpu: Mapped[str | None]
    toolchain: Mapped[dict[str, Any] | None]
    key: Mapped[str | None]


class ArtifactEvidence(Base):
    __table__: ClassVar[FromClause] = tables.ARTIFACT_EVIDENCE

    artifact_id: Mapped[int]
    gpu: Mapped[str]
    best_tokens_per_s: Mapped[float | None]
    passed_at: Mapped[datetime]


class Alias(Base):
    __table__: ClassVar[FromClause] = tables.ALIASES

    name: Mapped[str]
    digest: Mapped[str]
    updated_at: Mapped[datetime]


class AliasEventRow(Base):
    __table__: ClassVar[FromClause] = tables.ALIAS_EVENTS

    id: Mapped[int]
    name: Mapped[str]
    digest: Mapped[str | None]
    previous_digest: Mapped[str | None]
    at: Mapped[datetime]
    note: Mapped[str | None]
    details: Mapped[dict[str, Any] | None]


class ToolchainRow(Base):
    __table__: ClassVar[FromClause] = tables.TOOLCHAINS

    id: Mapped[int]
    pool: Mapped[str]
    gpu: Mapped[str]
    fingerprint: Mapped[dict[str, Any]]
    host: Mapped[str]
    probed_at: Mapped[datetime]
    node_id: Mapped[str | None]


class Recipe(Base):
    __table__: ClassVar[FromClause] = tables.RECIPES

    digest: Mapped[str]
    name: Mapped[str]
    text: Mapped[str]
    created_at: Mapped[datetime]
    path: Mapped[str | None]
    last_used_at: Mapped[datetime | None]


class PendingPublish(Base):
    __table__: ClassVar[FromClause] = tables.PENDING_PUBLISHES

    id: Mapped[str]
    owner: Mapped[str]
    started_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    blobs: Mapped[list[str]]


class NightlyRun(Base):
    __table__: ClassVar[FromClause] = tables.NIGHTLY_RUNS

    id: Mapped[int]
    owner: Mapped[str]
    host: Mapped[str]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    status: Mapped[str]
    exit_code: Mapped[int | None]
    report: Mapped[dict[str, Any] | None]
