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

Leases (`registry.leases`) and smoke reports (`registry.smoke_records`) live in modules of
their own; their names are re-exported here, where callers have always found them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import Select, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from registry.digest import Digest
from registry.errors import ConflictError, RecordNotFoundError
from registry.leases import (
    RunStatus,
    StageRunRecord,
    cancel_run,
    get_stage_run,
    get_stage_runs,
    release_lease,
    renew_lease,
    try_acquire_lease,
)
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
from registry.models import SmokeReport as SmokeReportRow
from registry.models import Toolchain as ToolchainRow
from registry.rows import artifact_id as row_id
from registry.rows import insert_for
from registry.smoke_records import (
    SmokeReport,
    add_smoke_report,
    smoke_reports,
)

ArtifactKind = Literal[
    "trtllm-engine", "trtllm-checkpoint", "vllm", "hf-checkpoint", "quantized-checkpoint",
    "converted-checkpoint",
]
ArtifactStatus = Literal["building", "built", "ready", "quarantined", "superseded", "deleted"]


__all__ = [  # the re-exported names too
    "AliasEvent",
    "ArtifactKind",
    "ArtifactRecord",
    "ArtifactStatus",
    "FileRecord",
    "RecordedRecipe",
    "RunStatus",
    "SmokeReport",
    "StageRunRecord",
    "ToolchainProbe",
    "add_artifact",
    "add_artifact_if_absent",
    "add_smoke_report",
    "alias_history",
    "aliased_in_history",
    "aliases_for",
    "cancel_run",
    "find_by_keys",
    "find_by_prefix",
    "get_alias",
    "get_artifact",
    "get_recipe_text",
    "get_stage_run",
    "get_stage_runs",
    "get_status",
    "history_blobs",
    "insert_alias_event",
    "list_artifacts",
    "mark_deleted",
    "put_alias",
    "record_recipe",
    "record_toolchain",
    "recorded_recipes",
    "referenced_blobs",
    "referenced_digests",
    "release_lease",
    "remove_alias",
    "renew_lease",
    "set_alias",
    "set_status",
    "smoke_reports",
    "toolchain_history",
    "touch_recipe",
    "try_acquire_lease",
]


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
    stmt = insert_for(session, Artifact).values(values)
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
    row_id(session, digest, lock=True)
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


def aliased_in_history(session: Session, keep_superseded: int | None = None) -> set[str]:
    """What gc keeps for alias history: every artifact an alias points at now, and those
    it pointed at before — all of them (*keep_superseded* None), or the last
    *keep_superseded* distinct ones of each alias (rollback targets, and what an audit of
    "what was prod" needs)."""
    kept = set(session.scalars(select(Alias.digest)))
    query = (select(AliasEventRow.name, AliasEventRow.digest)
             .where(AliasEventRow.digest.is_not(None)).order_by(AliasEventRow.id.desc()))
    current = dict(session.execute(select(Alias.name, Alias.digest)).tuples().all())
    before: dict[str, list[str]] = {}
    for name, digest in session.execute(query).tuples():
        if digest is None or digest == current.get(name):
            continue
        seen = before.setdefault(name, [])
        if digest not in seen and (keep_superseded is None or len(seen) < keep_superseded):
            seen.append(digest)
    for digests in before.values():
        kept.update(digests)
    return kept


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
    if row_id(session, digest, lock=False)[1] == "deleted":
        raise ConflictError(f"artifact {digest} is deleted; it cannot be aliased", what=digest)
    at = at or utcnow()
    locked = select(Alias.digest).where(Alias.name == name).with_for_update()
    previous = session.scalar(locked)
    if previous is None:
        stmt = insert_for(session, Alias).values(name=name, digest=digest, updated_at=at)
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


def record_recipe(session: Session, digest: str, name: str, text: str) -> bool:
    """Store a recipe's text under its content digest; False when it was already there."""
    stmt = insert_for(session, Recipe).values(
        digest=digest, name=name, text=text, created_at=utcnow()
    )
    inserted = session.execute(stmt.on_conflict_do_nothing().returning(Recipe.digest)).first()
    return inserted is not None


def touch_recipe(session: Session, digest: str, path: Path) -> None:
    """Note that the recipe stored under *digest* was just built from *path* (what a
    nightly without arguments reads: every recipe at its latest content)."""
    session.execute(update(Recipe).where(Recipe.digest == digest)
                    .values(path=str(path.resolve()), last_used_at=utcnow()))


@dataclass(frozen=True, slots=True)
class RecordedRecipe:
    digest: str
    name: str
    text: str
    path: str


def recorded_recipes(session: Session) -> list[RecordedRecipe]:
    """Each recipe name's latest built content (with where it was read), by name."""
    query = (select(Recipe.digest, Recipe.name, Recipe.text, Recipe.path)
             .where(Recipe.path.is_not(None), Recipe.last_used_at.is_not(None))
             .order_by(Recipe.last_used_at, Recipe.digest))
    latest = {row.name: RecordedRecipe(row.digest, row.name, row.text, row.path or "")
              for row in session.execute(query)}
    return [latest[name] for name in sorted(latest)]


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
