"""reindex: rebuild an empty registry from the store (the bucket is the whole truth).

Every manifest becomes an artifact row; the store's records (`registry.ops.history`) give each
its last status (ready, quarantined, superseded, deleted, …, with the reason and the recipe
it was built from), its smoke reports (and so `best_tokens_per_s`), and every alias with its
whole history. An artifact without status records comes back `built`.

One bad object never stops it: a manifest that does not verify or parse, a record that is
not JSON or disagrees with its key, a record or alias of an artifact the store has no
manifest for — each is skipped and reported, and the caller (the CLI) exits 4 with the
count once everything else is in. The records of artifacts that ended `deleted` and whose
manifest gc removed are history, not problems.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from registry.errors import IntegrityError, ManifestError, NotFoundError, UsageError
from registry.ops import history
from registry.ops.fetch import load_manifest
from registry.ops.publish import record_of
from registry.sql import alias_records, records, smoke_records
from registry.workers import WORKERS, Workers

if TYPE_CHECKING:
    from registry.context import Context


@dataclass
class Reindexed:
    artifacts: int = 0
    statuses: int = 0
    """Artifacts whose status came back from a record (the rest are `built`)."""
    smoke_reports: int = 0
    aliases: int = 0
    alias_moves: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class _Events:
    statuses: list[history.StatusRecord] = field(default_factory=list)
    smoke: list[smoke_records.SmokeRecord] = field(default_factory=list)


def _read_records(ctx: Context, result: Reindexed) -> tuple[dict[str, _Events],
                                                             list[history.AliasRecord]]:
    events: dict[str, _Events] = defaultdict(_Events)
    moves: list[tuple[str, history.AliasRecord]] = []

    def read(key: str) -> history.Record | str:
        try:
            return history.parse(key, ctx.store.get_object(key))
        except (ValueError, NotFoundError) as exc:
            return f"record {key}: {exc}"

    keys = list(history.iter_names(ctx.store))
    with Workers(WORKERS, name="reindex") as pool:  # one small GET each: in parallel
        found_records = list(pool.map(read, keys))
    for key, record in zip(keys, found_records, strict=True):
        if isinstance(record, str):
            result.problems.append(record)
            continue
        if isinstance(record, history.AliasRecord):
            moves.append((key, record))
        elif isinstance(record, history.StatusRecord):
            events[record.artifact].statuses.append(record)
        else:
            events[record.digest].smoke.append(record)
    for found in events.values():
        found.statuses.sort(key=lambda r: r.at)
        found.smoke.sort(key=lambda r: r.created_at)
    moves.sort(key=lambda item: (item[1].at, item[0]))
    return events, [move for _, move in moves]


def reindex(ctx: Context) -> Reindexed:
    """Rebuild the registry from the store; refuses a registry that is not empty."""
    with ctx.registry.session(readonly=True) as session:
        if records.list_artifacts(session):
            raise UsageError("the registry is not empty; reindex only rebuilds an empty one "
                             "(point ENGINECTL_REGISTRY_URL at a new database)")
    result = Reindexed()
    events, moves = _read_records(ctx, result)
    registered: set[str] = set()
    for digest in sorted(ctx.store.iter_manifests()):
        try:
            manifest = load_manifest(ctx, str(digest))
        except (NotFoundError, IntegrityError, ManifestError) as exc:
            result.problems.append(f"manifest {digest}: {exc}")
            continue
        found = events.get(str(digest), _Events())
        record = record_of(manifest, status="built", status_reason="reindexed from the store")
        if found.statuses:
            first, last = found.statuses[0], found.statuses[-1]
            record = replace(record, status=last.status, status_reason=last.reason,
                             recipe_digest=next((s.recipe_digest for s in found.statuses
                                                 if s.recipe_digest), None),
                             created_at=first.at, updated_at=last.at)
            result.statuses += 1
        with ctx.registry.session() as session:
            records.add_artifact_if_absent(session, record)
            for report in found.smoke:
                smoke_records.add_smoke_report(session, record.digest, report.passed, report.report,
                                               gpu=report.gpu, toolchain=report.toolchain,
                                               key=report.key, created_at=report.created_at)
        result.smoke_reports += len(found.smoke)
        registered.add(record.digest)
        result.artifacts += 1
    for artifact, found in sorted(events.items()):
        if artifact not in registered and not (
                found.statuses and found.statuses[-1].status == "deleted"):
            result.problems.append(f"records of {artifact}: the store has no manifest for it")
    _restore_aliases(ctx, moves, registered, result)
    return result


def _restore_aliases(ctx: Context, moves: list[history.AliasRecord], registered: set[str],
                     result: Reindexed) -> None:
    """Replay every alias move in time order; each alias ends where its last move put it."""
    last: dict[str, history.AliasRecord] = {}
    with ctx.registry.session() as session:
        for move in moves:
            alias_records.insert_alias_event(session, move.name, move.digest, move.previous_digest,
                                             at=move.at, note=move.note, details=move.details)
            last[move.name] = move
        result.alias_moves = len(moves)
        for name, move in sorted(last.items()):
            if move.digest is None:
                continue
            if move.digest not in registered:
                result.problems.append(f"alias {name}: it points at {move.digest}, which the "
                                       "store has no manifest for; its history is kept")
                continue
            alias_records.put_alias(session, name, move.digest, at=move.at)
            result.aliases += 1
