"""What happened to artifacts, written to the store and to SQL by one call each.

The bucket is the whole truth: besides blobs and manifests it holds one small immutable JSON
record per event (keys in `registry.identity.layout`), enough for `reindex` to rebuild statuses,
smoke evidence and aliases with their history:

    records/sha256/<artifact hex>/status/<at>-<token>.json
        {"schema", "type": "status", "artifact", "status", "reason", "at", "recipe_digest"}
    records/sha256/<artifact hex>/smoke/<at>-<token>.json
        {"schema", "type": "smoke", "artifact", "passed", "report", "created_at", "gpu",
         "toolchain", "key"}                       (report["log"]: the log's blob, if stored)
    aliases/<name>/<at>-<token>.json
        {"schema", "type": "alias", "name", "digest" (null: removed), "previous_digest",
         "at", "note", "details"}

Every writer of these rows goes through here: the SQL statements run first inside the
caller's transaction (so a refused change, such as deleting an aliased artifact, writes
nothing), then the store record is put, then the caller's transaction commits. The record is
durable before the row: a crash in between leaves a store that says a little more than SQL,
which `reindex` reconciles, never a row the store cannot back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from registry.identity.digest import Digest, digest_file
from registry.identity.layout import (
    ALIASES,
    RECORDS,
    alias_record_name,
    parse_alias_record_name,
    parse_record_name,
    record_name,
)
from registry.sql import alias_records, records, smoke_records
from registry.sql.smoke_records import SmokeRecord
from registry.sql.tables import ARTIFACT_STATUSES, utcnow

if TYPE_CHECKING:
    from registry.context import Context
    from registry.sql.rows import Executor
    from registry.store.base import Store

SCHEMA: Final = "enginectl.record/v1"


@dataclass(frozen=True, slots=True)
class StatusRecord:
    artifact: str
    status: records.ArtifactStatus
    reason: str | None
    at: datetime
    recipe_digest: str | None = None


@dataclass(frozen=True, slots=True)
class AliasRecord:
    name: str
    digest: str | None
    previous_digest: str | None
    at: datetime
    note: str | None = None
    details: dict[str, Any] | None = None


Record = StatusRecord | SmokeRecord | AliasRecord
"""A smoke record is the `SmokeRecord` SQL keeps (`registry.sql.smoke_records`); in the store
its `digest` is written as "artifact", like a status record's."""
_TYPES: Final[dict[type, Literal["status", "smoke", "alias"]]] = {
    StatusRecord: "status", SmokeRecord: "smoke", AliasRecord: "alias"}


def _when(record: Record) -> datetime:
    return record.created_at if isinstance(record, SmokeRecord) else record.at


def artifact_of(record: StatusRecord | SmokeRecord) -> str:
    """The digest of the artifact a status or smoke record is about."""
    return record.digest if isinstance(record, SmokeRecord) else record.artifact


def name_of(record: Record, token: str) -> str:
    if isinstance(record, AliasRecord):
        return alias_record_name(record.name, record.at, token)
    return record_name(Digest.parse(artifact_of(record)), _TYPES[type(record)], _when(record),
                       token)


def to_bytes(record: Record) -> bytes:
    values = asdict(record)
    if isinstance(record, SmokeRecord):
        values["artifact"] = values.pop("digest")
    for name in ("at", "created_at"):
        if name in values:
            values[name] = values[name].isoformat()
    return json.dumps({"schema": SCHEMA, "type": _TYPES[type(record)], **values},
                      sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def put(store: Store, record: Record) -> str:
    """Write *record* under a new key; the key."""
    key = name_of(record, uuid.uuid4().hex)
    store.put_object(key, to_bytes(record))
    return key


def parse(key: str, data: bytes) -> Record:
    """The record stored at *key*; ValueError naming what is wrong (its key and content
    must agree: type, artifact or alias name, and time)."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("schema") != SCHEMA:
        raise ValueError(f"not an {SCHEMA} object")
    try:
        return _parse_alias(key, value) if key.startswith(ALIASES) else _parse_event(key, value)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a field is missing or of the wrong type: {exc}") from exc


def _parse_alias(key: str, value: dict[str, Any]) -> AliasRecord:
    where = parse_alias_record_name(key)
    record = AliasRecord(
        name=_text(value, "name"), digest=_digest(value, "digest", optional=True),
        previous_digest=_digest(value, "previous_digest", optional=True),
        at=_time(value, "at"), note=_optional_text(value, "note"),
        details=_optional_dict(value, "details"))
    if value.get("type") != "alias" or record.name != where.name or record.at != where.at:
        raise ValueError("its name, type or time differs from its key")
    return record


def _parse_event(key: str, value: dict[str, Any]) -> StatusRecord | SmokeRecord:
    found = parse_record_name(key)
    if value.get("type") != found.kind or value.get("artifact") != str(found.artifact):
        raise ValueError("its type or artifact differs from its key")
    record: StatusRecord | SmokeRecord
    if found.kind == "status":
        status = _text(value, "status")
        if status not in ARTIFACT_STATUSES:
            raise ValueError(f"unknown status {status!r}")
        record = StatusRecord(str(found.artifact), cast("records.ArtifactStatus", status),
                              _optional_text(value, "reason"), _time(value, "at"),
                              _digest(value, "recipe_digest", optional=True))
    else:
        passed = value.get("passed")
        if not isinstance(passed, bool):
            raise ValueError("'passed' is not true or false")
        record = SmokeRecord(
            str(found.artifact), passed, _dict(value, "report"), _time(value, "created_at"),
            _optional_text(value, "gpu"), _optional_dict(value, "toolchain"),
            _optional_text(value, "key"))
    if _when(record) != found.at:
        raise ValueError("its time differs from its key")
    return record


def _text(value: dict[str, Any], name: str) -> str:
    field = value[name]
    if not isinstance(field, str):
        raise TypeError(name)
    return field


def _optional_text(value: dict[str, Any], name: str) -> str | None:
    return None if value.get(name) is None else _text(value, name)


def _dict(value: dict[str, Any], name: str) -> dict[str, Any]:
    field = value[name]
    if not isinstance(field, dict):
        raise TypeError(name)
    return field


def _optional_dict(value: dict[str, Any], name: str) -> dict[str, Any] | None:
    return None if value.get(name) is None else _dict(value, name)


def _digest(value: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    if optional and value.get(name) is None:
        return None
    return str(Digest.parse(_text(value, name)))


def _time(value: dict[str, Any], name: str) -> datetime:
    at = datetime.fromisoformat(_text(value, name))
    if at.tzinfo is None:
        raise ValueError(f"{name} has no time zone")
    return at


def iter_names(store: Store) -> Iterator[str]:
    """Every object under `records/` and `aliases/` (callers parse each one strictly) but
    the temp files of writes that were killed before their rename (the file store's
    `.<name>.<hex>.tmp`, which no record name is): `gc` removes those."""
    for prefix in (RECORDS, ALIASES):
        for info in store.list_objects(prefix):
            name = info.key.rpartition("/")[2]
            if not (name.startswith(".") and name.endswith(".tmp")):
                yield info.key


# writers: SQL statements, then the store record, then the caller's commit


def set_status_and_record(store: Store, session: Executor, digest: str,
                          status: records.ArtifactStatus, reason: str | None = None) -> None:
    """Move *digest* to *status* (`records.set_status`'s rules) and record it."""
    at = utcnow()
    records.set_status(session, digest, status, reason, at=at)
    put(store, StatusRecord(digest, status, reason, at))


def record_registered(store: Store, record: records.ArtifactRecord) -> None:
    """Record the status a newly registered artifact starts with (call it after the row is
    inserted, before its transaction commits)."""
    at = record.created_at or utcnow()
    put(store, StatusRecord(record.digest, record.status, record.status_reason, at,
                            record.recipe_digest))


def add_smoke_report_and_record(store: Store, session: Executor, digest: str, passed: bool,
                                report: dict[str, Any], *, gpu: str | None = None,
                                toolchain: dict[str, Any] | None = None,
                                key: str | None = None) -> None:
    """Attach a smoke report to *digest* (`smoke_records.add_smoke_report`) and record it."""
    at = utcnow()
    smoke_records.add_smoke_report(session, digest, passed, report, gpu=gpu, toolchain=toolchain,
                                   key=key, created_at=at)
    put(store, SmokeRecord(digest, passed, report, at, gpu, toolchain, key))


def set_alias_and_record(store: Store, session: Executor, name: str, digest: str,
                         note: str | None = None, *, details: dict[str, Any] | None = None,
                         always: bool = False) -> str | None:
    """Point *name* at *digest* (`alias_records.set_alias`) and record the move; no record when
    it already pointed there, unless *always* (a tag that clears a rollback's pin). Returns
    the digest it pointed at before."""
    at = utcnow()
    previous = alias_records.set_alias(session, name, digest, note, details=details, at=at,
                                       always=always)
    if previous != digest or always:
        put(store, AliasRecord(name, digest, previous, at, note, details))
    return previous


def remove_alias_and_record(store: Store, session: Executor, name: str,
                            note: str | None = None) -> str:
    """Remove *name* (`alias_records.remove_alias`) and record it; returns its last digest."""
    at = utcnow()
    previous = alias_records.remove_alias(session, name, note, at=at)
    put(store, AliasRecord(name, None, previous, at, note))
    return previous


def record_smoke(
    ctx: Context, digest: str, passed: bool, report: dict[str, Any], *,
    status: records.ArtifactStatus, reason: str | None = None, log: Path | None = None,
    gpu: str | None = None, toolchain: dict[str, Any] | None = None, key: str | None = None,
) -> str | None:
    """A smoke run's outcome in one call: its log stored as a blob (kept by gc, which keeps
    every blob a smoke report references, and named by the report's `log`), the report,
    and the artifact's new *status*, each recorded in the store and then in SQL. Returns
    the log's digest (None without a log file).

    A passing re-smoke of a `superseded` artifact leaves it superseded: the report is new
    evidence, but what replaced it (a promotion, a rollback away from it) still stands."""
    from registry.ops.pending import Pending

    sources: dict[Digest, Path] = {}
    if log is not None and log.is_file():
        sources[digest_file(log, with_sha256=False).xxh3] = log
    log_digest = str(next(iter(sources))) if sources else None
    pending = Pending.begin(ctx, sources, renew=False)
    try:
        pending.upload()
        with pending.committing() as session:
            kept = {**report, "log": log_digest} if log_digest else report
            add_smoke_report_and_record(ctx.store, session, digest, passed, kept, gpu=gpu,
                                        toolchain=toolchain, key=key)
            if not (status == "ready" and records.get_status(session, digest) == "superseded"):
                set_status_and_record(ctx.store, session, digest, status, reason)
    finally:
        pending.end()
    return log_digest
