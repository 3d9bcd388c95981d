"""What the rest of enginectl reads and writes in the SQL registry, as plain dataclasses.

Every function takes a `Session` from `Registry.session()` and works inside the caller's
transaction; none commits. ORM objects never leave this module. Digests are the strings
`str(Digest)` writes (`sha256:<hex>`, `xxh3-128:<hex>`); times are aware UTC datetimes.

Writes that race across processes are atomic in SQL (INSERT ... ON CONFLICT, conditional
UPDATE), so they are correct on PostgreSQL under concurrency and on SQLite, where
`Registry.session()` already serialises writers.

Status changes, alias moves and smoke reports are also records in the store (the bucket is
the whole truth): write them through `registry.history`, which puts the store record and
then these rows in one call; the writers here are the SQL half (and what `reindex` replays).

Over 500 lines on purpose, for now: splitting it (leases, toolchains and recipes into modules
of their own) moves functions that other branches are editing; due after they merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from sqlalchemy import Select, Table, case, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from registry.digest import Digest
from registry.errors import ConflictError, RecordNotFoundError
from registry.models import (
    ARTIFACT_KINDS,
    ARTIFACT_STATUSES,
    Alias,
    Artifact,
    ArtifactFile,
    Recipe,
    StageRun,
    utcnow,
)
from registry.models import AliasEvent as AliasEventRow
from registry.models import ArtifactEvidence as EvidenceRow
from registry.models import SmokeReport as SmokeReportRow
from registry.models import Toolchain as ToolchainRow

ArtifactKind = Literal[
    "trtllm-engine", "trtllm-checkpoint", "vllm", "hf-checkpoint", "quantized-checkpoint",
    "converted-checkpoint",
]
ArtifactStatus = Literal["building", "built", "ready", "quarantined", "superseded", "deleted"]
RunStatus = Literal["running", "succeeded", "failed", "cancelled"]


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


@dataclass(frozen=True, slots=True)
class AliasEvent:
    name: str
    digest: str | None
    """None when the alias was removed."""
    previous_digest: str | None
    at: datetime
    note: str | None
    details: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SmokeReport:
    digest: str
    passed: bool
    report: dict[str, Any]
    created_at: datetime
    gpu: str | None = None
    """Where it ran: a catalog SKU or "CPU"; None for reports from before schema 0003."""
    toolchain: dict[str, Any] | None = None
    key: str | None = None
    """The smoke stage key that produced it (None for `enginectl smoke` and old reports)."""


@dataclass(frozen=True, slots=True)
class StageRunRecord:
    key: str
    status: RunStatus
    host: str
    pid: int
    owner: str
    started_at: datetime
    finished_at: datetime | None
    lease_expires_at: datetime
    artifact_digest: str | None
    log_location: str | None
    error: str | None
    node_id: str | None = None


_ARTIFACT_COLUMNS = tuple(f.name for f in fields(ArtifactRecord) if f.name != "files")


def _insert(session: Session, table: Table | type[Any]) -> Any:
    """INSERT with ON CONFLICT support on the session's dialect."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":  # imported here: neither dialect is needed to read
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def _artifact_id(session: Session, digest: str, *, lock: bool | None = None) -> tuple[int, str]:
    """The artifact's row id and status; *lock* False/True takes a shared/exclusive row lock
    (PostgreSQL; SQLite write sessions are serialised already)."""
    query = select(Artifact.id, Artifact.status).where(Artifact.digest == digest)
    if lock is not None:
        query = query.with_for_update(read=not lock)
    row = session.execute(query).first()
    if row is None:
        raise RecordNotFoundError("artifact", digest, hint="see `enginectl ls`")
    return row.id, row.status


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


def _add_files(session: Session, artifact_id: int, files: tuple[FileRecord, ...]) -> None:
    if files:
        session.execute(
            insert(ArtifactFile),
            [{"artifact_id": artifact_id, "path": f.path, "size": f.size, "xxh3": f.xxh3,
              "sha256": f.sha256} for f in files],
        )


def add_artifact(session: Session, record: ArtifactRecord) -> int:
    """Insert *record* and its files; returns the row id. `ConflictError` if the digest
    is already registered (the caller's transaction stays usable)."""
    values = _check_record(record)
    try:
        with session.begin_nested():
            artifact_id: int = session.execute(
                insert(Artifact).values(values).returning(Artifact.id)
            ).scalar_one()
            _add_files(session, artifact_id, record.files)
    except IntegrityError as exc:
        raise ConflictError(
            f"artifact {record.digest} is already registered", what=record.digest
        ) from exc
    return artifact_id


def add_artifact_if_absent(session: Session, record: ArtifactRecord) -> bool:
    """Insert *record* unless its digest exists (in any status); True when inserted.
    Safe when several processes insert the same digest at once: one row, no error."""
    values = _check_record(record)
    stmt = _insert(session, Artifact).values(values)
    stmt = stmt.on_conflict_do_nothing(index_elements=["digest"]).returning(Artifact.id)
    artifact_id = session.execute(stmt).scalar_one_or_none()
    if artifact_id is None:
        return False
    _add_files(session, artifact_id, record.files)
    return True


# Reads select table columns, not ORM entities: rows, never stale identity-map objects.
_ARTIFACTS = cast(Table, Artifact.__table__)
_FILES = cast(Table, ArtifactFile.__table__)


def _records(session: Session, query: Select[Any]) -> list[ArtifactRecord]:
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


def get_artifact(session: Session, digest: str) -> ArtifactRecord | None:
    found = _records(session, select(_ARTIFACTS).where(_ARTIFACTS.c.digest == digest))
    return found[0] if found else None


def find_by_prefix(session: Session, hex_prefix: str) -> list[str]:
    """Digests starting with *hex_prefix* (`9f86…` or `sha256:9f86…`), sorted."""
    prefix = hex_prefix.removeprefix("sha256:").lower()
    if not prefix or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"not a hex digest prefix: {hex_prefix!r}")
    query = select(Artifact.digest).where(Artifact.digest.startswith(f"sha256:{prefix}"))
    return sorted(session.scalars(query))


def list_artifacts(
    session: Session,
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
    query = select(_ARTIFACTS).order_by(Artifact.created_at, Artifact.id)
    for column, value in (
        (Artifact.model, model), (Artifact.gpu, gpu), (Artifact.kind, kind),
        (Artifact.quant, quant), (Artifact.status, status),
    ):
        if value is not None:
            query = query.where(column == value)
    if alias is not None:
        query = query.join(Alias, Alias.digest == Artifact.digest).where(Alias.name == alias)
    return _records(session, query)


def set_status(
    session: Session, digest: str, status: ArtifactStatus, reason: str | None = None,
    *, at: datetime | None = None,
) -> None:
    """Move an artifact to *status* (any transition) with *reason* (None clears it), as of
    *at* (now). Moving to `deleted` is refused with `ConflictError` while an alias points
    at it."""
    if status not in ARTIFACT_STATUSES:
        raise ValueError(f"unknown artifact status {status!r}")
    _artifact_id(session, digest, lock=True)
    if status == "deleted" and (names := aliases_for(session, digest)):
        raise ConflictError(
            f"artifact {digest} is still aliased as {', '.join(names)}; "
            "move or remove those aliases first", what=digest,
        )
    session.execute(
        update(Artifact).where(Artifact.digest == digest)
        .values(status=status, status_reason=reason, updated_at=at or utcnow())
    )


def get_status(session: Session, digest: str) -> str | None:
    """The artifact's status; None when it is not registered."""
    return session.scalar(select(Artifact.status).where(Artifact.digest == digest))


def mark_deleted(session: Session, digest: str, reason: str | None = None) -> None:
    set_status(session, digest, "deleted", reason)


def referenced_digests(session: Session) -> set[str]:
    """Digests of every artifact not deleted: the manifests `gc` must keep."""
    return set(session.scalars(select(Artifact.digest).where(Artifact.status != "deleted")))


def referenced_blobs(session: Session) -> set[str]:
    """xxh3 digests of every file of an artifact not deleted: the blobs `gc` must keep."""
    query = (
        select(ArtifactFile.xxh3).distinct()
        .join(Artifact, Artifact.id == ArtifactFile.artifact_id)
        .where(Artifact.status != "deleted")
    )
    return set(session.scalars(query))


def history_blobs(session: Session) -> set[str]:
    """Blobs that history references: every stage run's log (`stage_runs.log_location`)
    and every smoke report's log (its report's `log`, a file digest): gc keeps them."""
    found = {location for location in session.scalars(
        select(StageRun.log_location).where(StageRun.log_location.is_not(None)))
        if location and location.startswith("xxh3-128:")}
    for report in session.scalars(select(SmokeReportRow.report)):
        log = report.get("log") if isinstance(report, dict) else None
        if isinstance(log, str) and log.startswith("xxh3-128:"):
            found.add(log)
    return found


def aliased_in_history(session: Session) -> set[str]:
    """Every artifact an alias points at or ever pointed at (rollback targets, and what an
    audit of "what was prod" needs): gc keeps their manifests and blobs, deleted or not."""
    moved = session.scalars(select(AliasEventRow.digest).where(AliasEventRow.digest.is_not(None)))
    return {digest for digest in moved if digest} | set(session.scalars(select(Alias.digest)))


def insert_alias_event(session: Session, name: str, digest: str | None, previous: str | None,
                       *, at: datetime, note: str | None = None,
                       details: dict[str, Any] | None = None) -> None:
    """Append one move of *name* to its history as it is (what `reindex` replays)."""
    session.execute(insert(AliasEventRow).values(
        name=name, digest=digest, previous_digest=previous, at=at, note=note, details=details))


def put_alias(session: Session, name: str, digest: str | None, *, at: datetime) -> None:
    """Make *name* point at *digest* (None: no alias) without touching its history."""
    session.execute(delete(Alias).where(Alias.name == name))
    if digest is not None:
        session.execute(insert(Alias).values(name=name, digest=digest, updated_at=at))


def set_alias(session: Session, name: str, digest: str, note: str | None = None, *,
              details: dict[str, Any] | None = None, at: datetime | None = None) -> str | None:
    """Point *name* at *digest*, record the move (with *note* and *details*, as of *at*) in
    the history, and return the digest it pointed at before (None when new). Pointing it
    where it already points changes nothing. A deleted artifact cannot be aliased
    (`ConflictError`)."""
    if _artifact_id(session, digest, lock=False)[1] == "deleted":
        raise ConflictError(f"artifact {digest} is deleted; it cannot be aliased", what=digest)
    at = at or utcnow()
    locked = select(Alias.digest).where(Alias.name == name).with_for_update()
    previous = session.scalar(locked)
    if previous is None:
        stmt = _insert(session, Alias).values(name=name, digest=digest, updated_at=at)
        if session.execute(stmt.on_conflict_do_nothing().returning(Alias.name)).first():
            insert_alias_event(session, name, digest, None, at=at, note=note, details=details)
            return None
        previous = session.scalar(locked)  # another writer created it meanwhile
    if previous == digest:
        return previous
    session.execute(
        update(Alias).where(Alias.name == name).values(digest=digest, updated_at=at)
    )
    insert_alias_event(session, name, digest, previous, at=at, note=note, details=details)
    return previous


def remove_alias(session: Session, name: str, note: str | None = None, *,
                 at: datetime | None = None) -> str:
    """Remove *name* (history keeps an event with digest None); returns its last digest."""
    previous = session.scalar(delete(Alias).where(Alias.name == name).returning(Alias.digest))
    if previous is None:
        raise RecordNotFoundError("alias", name)
    insert_alias_event(session, name, None, previous, at=at or utcnow(), note=note)
    return previous


def get_alias(session: Session, name: str) -> str | None:
    return session.scalar(select(Alias.digest).where(Alias.name == name))


def aliases_for(session: Session, digest: str) -> list[str]:
    return sorted(session.scalars(select(Alias.name).where(Alias.digest == digest)))


def alias_history(session: Session, name: str) -> list[AliasEvent]:
    """Every move of *name*, oldest first."""
    query = (
        select(AliasEventRow.name, AliasEventRow.digest, AliasEventRow.previous_digest,
               AliasEventRow.at, AliasEventRow.note, AliasEventRow.details)
        .where(AliasEventRow.name == name).order_by(AliasEventRow.id)
    )
    return [AliasEvent(*row) for row in session.execute(query)]


def add_smoke_report(
    session: Session, digest: str, passed: bool, report: dict[str, Any], *,
    gpu: str | None = None, toolchain: dict[str, Any] | None = None, key: str | None = None,
    created_at: datetime | None = None,
) -> None:
    """Attach a smoke report to *digest* (its status is the caller's to move), measured on
    *gpu* (a catalog SKU or "CPU"; None: unknown) with *toolchain*, by the smoke run *key*,
    as of *created_at* (now; `reindex` gives the recorded time).

    A passing report's throughput raises the artifact's `best_tokens_per_s`, and, when *gpu*
    is known, the artifact's evidence on that GPU (`artifact_evidence`), which resolve ranks
    by: a report from elsewhere proves nothing about the node's own SKU."""
    artifact_id = _artifact_id(session, digest)[0]
    now = created_at or utcnow()
    session.execute(
        insert(SmokeReportRow).values(
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
        column = Artifact.best_tokens_per_s
        session.execute(
            update(Artifact)
            .where(Artifact.id == artifact_id, or_(column.is_(None), column < best))
            .values(best_tokens_per_s=best)
        )
    if gpu is not None:
        _raise_evidence(session, artifact_id, gpu, best, now)


def _raise_evidence(
    session: Session, artifact_id: int, gpu: str, best: float | None, now: datetime
) -> None:
    """Upsert the (artifact, gpu) evidence row: one atomic statement, so concurrent reports
    can only raise the best throughput; `passed_at` is the latest pass."""
    table = cast(Table, EvidenceRow.__table__)
    stmt = _insert(session, EvidenceRow).values(
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


def smoke_reports(session: Session, digest: str) -> list[SmokeReport]:
    """Smoke reports of *digest*, oldest first, each with where it ran."""
    query = (
        select(SmokeReportRow.passed, SmokeReportRow.report, SmokeReportRow.created_at,
               SmokeReportRow.gpu, SmokeReportRow.toolchain, SmokeReportRow.key)
        .where(SmokeReportRow.artifact_id == _artifact_id(session, digest)[0])
        .order_by(SmokeReportRow.created_at, SmokeReportRow.id)
    )
    return [SmokeReport(digest, *row) for row in session.execute(query)]


def try_acquire_lease(
    session: Session, key: str, *, owner: str, host: str, pid: int, ttl_s: float,
    now: datetime | None = None, node_id: str | None = None,
) -> bool:
    """Take the lease on stage *key* for *owner* until *now* + *ttl_s*; True when taken.

    Taken when no run exists, the run is finished (succeeded or failed), its lease has
    expired (a dead builder), or *owner* holds it already (the lease is renewed). One atomic
    statement: of several processes racing, exactly one wins. *now* is this host's clock;
    keep *ttl_s* well above the clock skew between builders. *node_id* is the Ray node that
    runs it (None off Ray); *host* is that node's hostname.
    """
    now = now or utcnow()
    values: dict[str, Any] = {
        "key": key, "status": "running", "host": host, "pid": pid, "owner": owner,
        "started_at": now, "finished_at": None, "lease_expires_at": now + timedelta(seconds=ttl_s),
        "artifact_digest": None, "log_location": None, "error": None, "node_id": node_id,
    }
    stmt = _insert(session, StageRun).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["key"],
        set_={name: value for name, value in values.items() if name != "key"},
        where=or_(
            StageRun.status != "running", StageRun.lease_expires_at <= now,
            StageRun.owner == owner,
        ),
    )
    return session.execute(stmt.returning(StageRun.key)).first() is not None


def renew_lease(
    session: Session, key: str, *, owner: str, ttl_s: float, now: datetime | None = None
) -> bool:
    """Extend *owner*'s running lease on *key*; False when it is no longer theirs."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner, StageRun.status == "running")
        .values(lease_expires_at=now + timedelta(seconds=ttl_s))
        .returning(StageRun.key)
    )
    return result.first() is not None


def release_lease(
    session: Session, key: str, *, owner: str,
    status: Literal["succeeded", "failed", "cancelled"],
    artifact_digest: str | None = None, error: str | None = None,
    log_location: str | None = None, now: datetime | None = None,
) -> bool:
    """Finish *owner*'s run of *key* with its outcome; False (nothing written) when the
    lease was taken over by someone else meanwhile."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner, StageRun.status == "running")
        .values(
            status=status, finished_at=now, lease_expires_at=now,
            artifact_digest=artifact_digest, error=error, log_location=log_location,
        )
        .returning(StageRun.key)
    )
    return result.first() is not None


def cancel_run(
    session: Session, key: str, *, owner: str, reason: str, now: datetime | None = None
) -> bool:
    """Mark *owner*'s run of *key* `cancelled` with *reason* (a driver's timeout, Ctrl-C):
    its lease is released, or a failure its worker recorded while being stopped is
    corrected. False (nothing written) when the run succeeded or belongs to someone else."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner,
               StageRun.status.in_(("running", "failed")))
        .values(status="cancelled", finished_at=now, lease_expires_at=now, error=reason)
        .returning(StageRun.key)
    )
    return result.first() is not None


def get_stage_run(session: Session, key: str) -> StageRunRecord | None:
    row = session.execute(select(StageRun.__table__).where(StageRun.key == key)).first()
    return None if row is None else StageRunRecord(**row._asdict())


def get_stage_runs(session: Session, keys: set[str]) -> dict[str, StageRunRecord]:
    """The stage runs of *keys* that exist, in one query."""
    if not keys:
        return {}
    query = select(StageRun.__table__).where(StageRun.key.in_(sorted(keys)))
    return {row.key: StageRunRecord(**row._asdict()) for row in session.execute(query)}


def record_recipe(session: Session, digest: str, name: str, text: str) -> bool:
    """Store a recipe's text under its content digest; False when it was already there."""
    stmt = _insert(session, Recipe).values(
        digest=digest, name=name, text=text, created_at=utcnow()
    )
    inserted = session.execute(stmt.on_conflict_do_nothing().returning(Recipe.digest)).first()
    return inserted is not None


def find_by_keys(session: Session, keys: set[str]) -> dict[str, ArtifactRecord]:
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


def get_recipe_text(session: Session, digest: str) -> str | None:
    """The text of the recipe stored under *digest*, if any."""
    return session.scalar(select(Recipe.text).where(Recipe.digest == digest))


@dataclass(frozen=True, slots=True)
class ToolchainProbe:
    """A toolchain fingerprint probed on one pool (`host:<name>` for a machine, a GPU SKU
    for a Ray pool) at one time, on one host."""

    pool: str
    gpu: str
    fingerprint: dict[str, Any]
    host: str
    probed_at: datetime
    node_id: str | None = None  # the Ray node probed (None off Ray)


def record_toolchain(session: Session, pool: str, gpu: str | None,
                     fingerprint: dict[str, Any], host: str, *,
                     node_id: str | None = None) -> None:
    """Record a probe of *pool* (*gpu* None: no GPU, recorded as "CPU") on *host* (and Ray
    node *node_id*)."""
    session.execute(insert(ToolchainRow).values(
        pool=pool, gpu=gpu or "CPU", fingerprint=fingerprint, host=host, probed_at=utcnow(),
        node_id=node_id))


def toolchain_history(session: Session, pool: str, limit: int = 2) -> list[ToolchainProbe]:
    """The last *limit* probes of *pool*, newest first."""
    query = (
        select(ToolchainRow.pool, ToolchainRow.gpu, ToolchainRow.fingerprint, ToolchainRow.host,
               ToolchainRow.probed_at, ToolchainRow.node_id)
        .where(ToolchainRow.pool == pool)
        .order_by(ToolchainRow.probed_at.desc(), ToolchainRow.id.desc()).limit(limit)
    )
    return [ToolchainProbe(*row) for row in session.execute(query)]
