"""What the rest of enginectl reads and writes in the SQL registry, as plain dataclasses.

Every function takes a `Session` from `Registry.session()`, or a Core connection from
`Registry.connection()` (a publish's, which never imports the ORM: `registry.sql.rows.Executor`),
and works inside the caller's transaction; none commits. The statements are Core, over
`registry.sql.tables`; ORM objects never leave `registry.sql`. Digests are the strings
`str(Digest)` writes (`sha256:<hex>`, `xxh3-128:<hex>`); times are aware UTC datetimes.

Writes that race across processes are atomic in SQL (INSERT ... ON CONFLICT, conditional
UPDATE), so they are correct on PostgreSQL under concurrency and on SQLite, where
`Registry.session()` already serialises writers.

Status changes, alias moves and smoke reports are also records in the store (the bucket is
the whole truth): write them through `registry.ops.history`, which puts the store record and
then these rows in one call; the writers here are the SQL half (and what `reindex` replays).

This module holds the artifacts and their files (and what gc must keep of them); the other
subjects have modules of their own, imported from there: aliases (`registry.sql.alias_records`),
recipes and toolchains (`registry.sql.build_inputs`), leases (`registry.sql.leases`) and smoke
reports (`registry.sql.smoke_records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Select, insert, select, update
from sqlalchemy.exc import IntegrityError

from registry.errors import ConflictError
from registry.identity.digest import Digest
from registry.sql.alias_records import aliases_for
from registry.sql.rows import artifact_id as row_id
from registry.sql.rows import insert_for
from registry.sql.tables import (
    ALIASES,
    ARTIFACT_FILES,
    ARTIFACT_KINDS,
    ARTIFACT_STATUSES,
    ARTIFACTS,
    SMOKE_REPORTS,
    STAGE_RUNS,
    utcnow,
)

if TYPE_CHECKING:
    from registry.sql.rows import Executor

ArtifactKind = Literal[
    "trtllm-engine", "trtllm-checkpoint", "vllm", "hf-checkpoint", "quantized-checkpoint",
    "converted-checkpoint", "warm-cache", "refit-equivalence",
]
ArtifactStatus = Literal["building", "built", "ready", "quarantined", "superseded", "deleted"]




@dataclass(frozen=True, slots=True)
class FileRecord:
    path: str
    size: int
    xxh3: str
    sha256: str


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """One artifact row and its files. `size` and `file_count` must agree with `files`;
    `created_at`/`updated_at` are filled in by the registry when left None."""

    digest: str
    kind: ArtifactKind
    model: str
    size: int
    file_count: int
    status: ArtifactStatus
    key: str | None = None
    runtime: str | None = None
    gpu: str | None = None
    sm: int | None = None
    quant: str | None = None
    kv_cache_dtype: str | None = None
    tp: int = 1
    pp: int = 1
    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    toolchain: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    status_reason: str | None = None
    recipe_digest: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    files: tuple[FileRecord, ...] = ()




_ARTIFACT_COLUMNS = tuple(f.name for f in fields(ArtifactRecord) if f.name != "files")


def _check_record(record: ArtifactRecord) -> dict[str, Any]:
    if Digest.parse(record.digest).algorithm != "sha256":
        raise ValueError(f"artifact digest must be sha256:<hex>, got {record.digest!r}")
    if record.kind not in ARTIFACT_KINDS:
        raise ValueError(f"unknown artifact kind {record.kind!r} (one of {ARTIFACT_KINDS})")
    if record.status not in ARTIFACT_STATUSES:
        raise ValueError(f"unknown artifact status {record.status!r}")
    if len({f.path for f in record.files}) != len(record.files):
        raise ValueError(f"{record.digest}: a file path appears twice")
    if record.files and (
        record.file_count != len(record.files)
        or record.size != sum(f.size for f in record.files)
    ):
        raise ValueError(f"{record.digest}: size/file_count disagree with its files")
    values = {name: getattr(record, name) for name in _ARTIFACT_COLUMNS}
    now = utcnow()
    values["created_at"] = record.created_at or now
    values["updated_at"] = record.updated_at or values["created_at"]
    return values


def _add_files(session: Executor, artifact_id: int, files: tuple[FileRecord, ...]) -> None:
    if files:
        session.execute(
            insert(ARTIFACT_FILES),
            [{"artifact_id": artifact_id, "path": f.path, "size": f.size, "xxh3": f.xxh3,
              "sha256": f.sha256} for f in files],
        )


def add_artifact(session: Executor, record: ArtifactRecord) -> int:
    """Insert *record* and its files; returns the row id. `ConflictError` if the digest
    is already registered (the caller's transaction stays usable)."""
    values = _check_record(record)
    try:
        with session.begin_nested():
            artifact_id: int = session.execute(
                insert(ARTIFACTS).values(values).returning(ARTIFACTS.c.id)
            ).scalar_one()
            _add_files(session, artifact_id, record.files)
    except IntegrityError as exc:
        raise ConflictError(
            f"artifact {record.digest} is already registered", what=record.digest
        ) from exc
    return artifact_id


def add_artifact_if_absent(session: Executor, record: ArtifactRecord) -> bool:
    """Insert *record* unless its digest exists (in any status); True when inserted.
    Safe when several processes insert the same digest at once: one row, no error."""
    values = _check_record(record)
    stmt = insert_for(session, ARTIFACTS).values(values)
    stmt = stmt.on_conflict_do_nothing(index_elements=["digest"]).returning(ARTIFACTS.c.id)
    artifact_id = session.execute(stmt).scalar_one_or_none()
    if artifact_id is None:
        return False
    _add_files(session, artifact_id, record.files)
    return True


_ARTIFACTS = ARTIFACTS
_FILES = ARTIFACT_FILES


def _records(session: Executor, query: Select[Any]) -> list[ArtifactRecord]:
    rows = session.execute(query).all()
    files: dict[int, list[FileRecord]] = {row.id: [] for row in rows}
    if rows:  # a subquery, not a list of ids: no limit on bound parameters
        ids = query.with_only_columns(_ARTIFACTS.c.id).order_by(None)
        file_query = select(_FILES).where(_FILES.c.artifact_id.in_(ids)).order_by(_FILES.c.path)
        for f in session.execute(file_query):
            if f.artifact_id in files:  # skip artifacts committed after the first query
                files[f.artifact_id].append(FileRecord(f.path, f.size, f.xxh3, f.sha256))
    return [
        ArtifactRecord(
            **{name: getattr(row, name) for name in _ARTIFACT_COLUMNS}, files=tuple(files[row.id])
        )
        for row in rows
    ]


def get_artifact(session: Executor, digest: str) -> ArtifactRecord | None:
    found = _records(session, select(_ARTIFACTS).where(_ARTIFACTS.c.digest == digest))
    return found[0] if found else None


def find_by_prefix(session: Executor, hex_prefix: str) -> list[str]:
    """Digests starting with *hex_prefix* (`9f86…` or `sha256:9f86…`), sorted."""
    prefix = hex_prefix.removeprefix("sha256:").lower()
    if not prefix or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"not a hex digest prefix: {hex_prefix!r}")
    query = select(ARTIFACTS.c.digest).where(ARTIFACTS.c.digest.startswith(f"sha256:{prefix}"))
    return sorted(session.scalars(query))


def list_artifacts(
    session: Executor,
    *,
    model: str | None = None,
    gpu: str | None = None,
    kind: str | None = None,
    quant: str | None = None,
    status: str | None = None,
    alias: str | None = None,
) -> list[ArtifactRecord]:
    """Artifacts matching every filter given (all statuses when *status* is None), oldest
    first; *alias* keeps only the artifact that alias points at."""
    query = select(_ARTIFACTS).order_by(ARTIFACTS.c.created_at, ARTIFACTS.c.id)
    for column, value in (
        (ARTIFACTS.c.model, model), (ARTIFACTS.c.gpu, gpu), (ARTIFACTS.c.kind, kind),
        (ARTIFACTS.c.quant, quant), (ARTIFACTS.c.status, status),
    ):
        if value is not None:
            query = query.where(column == value)
    if alias is not None:
        query = (query.join(ALIASES, ALIASES.c.digest == ARTIFACTS.c.digest)
                 .where(ALIASES.c.name == alias))
    return _records(session, query)


def set_status(
    session: Executor, digest: str, status: ArtifactStatus, reason: str | None = None,
    *, at: datetime | None = None,
) -> None:
    """Move an artifact to *status* (any transition) with *reason* (None clears it), as of
    *at* (now). Moving to `deleted` is refused with `ConflictError` while an alias points
    at it."""
    if status not in ARTIFACT_STATUSES:
        raise ValueError(f"unknown artifact status {status!r}")
    row_id(session, digest, lock=True)
    if status == "deleted" and (names := aliases_for(session, digest)):
        raise ConflictError(
            f"artifact {digest} is still aliased as {', '.join(names)}; "
            "move or remove those aliases first", what=digest,
        )
    session.execute(
        update(ARTIFACTS).where(ARTIFACTS.c.digest == digest)
        .values(status=status, status_reason=reason, updated_at=at or utcnow())
    )


def get_status(session: Executor, digest: str) -> str | None:
    """The artifact's status; None when it is not registered."""
    return session.scalar(select(ARTIFACTS.c.status).where(ARTIFACTS.c.digest == digest))


def mark_deleted(session: Executor, digest: str, reason: str | None = None) -> None:
    set_status(session, digest, "deleted", reason)


def referenced_digests(session: Executor) -> set[str]:
    """Digests of every artifact not deleted: the manifests `gc` must keep."""
    return set(session.scalars(select(ARTIFACTS.c.digest).where(ARTIFACTS.c.status != "deleted")))


def referenced_blobs(session: Executor) -> set[str]:
    """xxh3 digests of every file of an artifact not deleted: the blobs `gc` must keep."""
    query = (
        select(ARTIFACT_FILES.c.xxh3).distinct()
        .join(ARTIFACTS, ARTIFACTS.c.id == ARTIFACT_FILES.c.artifact_id)
        .where(ARTIFACTS.c.status != "deleted")
    )
    return set(session.scalars(query))


def history_blobs(session: Executor) -> set[str]:
    """Blobs that history references: every stage run's log (`stage_runs.log_location`)
    and every smoke report's log (its report's `log`, a file digest): gc keeps them."""
    found = {location for location in session.scalars(
        select(STAGE_RUNS.c.log_location).where(STAGE_RUNS.c.log_location.is_not(None)))
        if location and location.startswith("xxh3-128:")}
    for report in session.scalars(select(SMOKE_REPORTS.c.report)):
        log = report.get("log") if isinstance(report, dict) else None
        if isinstance(log, str) and log.startswith("xxh3-128:"):
            found.add(log)
    return found


























def find_by_keys(session: Executor, keys: set[str]) -> dict[str, ArtifactRecord]:
    """For each stage key, the newest artifact built for it that can be reused (not deleted
    or quarantined): "is this key already built?" for a whole plan in one query."""
    if not keys:
        return {}
    query = (
        select(_ARTIFACTS)
        .where(_ARTIFACTS.c.key.in_(sorted(keys)),
               _ARTIFACTS.c.status.not_in(("deleted", "quarantined")))
        .order_by(_ARTIFACTS.c.created_at, _ARTIFACTS.c.id)
    )
    found: dict[str, ArtifactRecord] = {}
    for record in _records(session, query):
        if record.key is not None:
            found[record.key] = record  # later rows win: the newest
    return found
