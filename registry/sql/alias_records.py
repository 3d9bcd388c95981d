"""Aliases in SQL: where each name points now, and every move it made (what `rollback`,
`gc`'s keep rules and `alias history` read). The store half, and the one call that writes
both, is `registry.ops.history`; the checks a user's tag goes through are `registry.ops.aliases`.
A rollback pins its alias (`pinned_by_rollback`, decided by `registry.sql.alias_pins`), read
from the same history.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update

from registry.errors import ConflictError, RecordNotFoundError
from registry.sql.alias_pins import AliasEvent, Pin, rollback_pin
from registry.sql.rows import artifact_id as row_id
from registry.sql.rows import insert_for
from registry.sql.tables import ALIAS_EVENTS, ALIASES, utcnow

if TYPE_CHECKING:
    from registry.sql.rows import Executor


def aliased_in_history(session: Executor, keep_superseded: int | None = None) -> set[str]:
    """What gc keeps for alias history: every artifact an alias points at now, and those
    it pointed at before — all of them (*keep_superseded* None), or the last
    *keep_superseded* distinct ones of each alias (rollback targets, and what an audit of
    "what was prod" needs)."""
    kept = set(session.scalars(select(ALIASES.c.digest)))
    query = (select(ALIAS_EVENTS.c.name, ALIAS_EVENTS.c.digest)
             .where(ALIAS_EVENTS.c.digest.is_not(None)).order_by(ALIAS_EVENTS.c.id.desc()))
    current = dict(session.execute(select(ALIASES.c.name, ALIASES.c.digest)).tuples().all())
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


def insert_alias_event(session: Executor, name: str, digest: str | None, previous: str | None,
                       *, at: datetime, note: str | None = None,
                       details: dict[str, Any] | None = None) -> None:
    """Append one move of *name* to its history as it is (what `reindex` replays)."""
    session.execute(insert(ALIAS_EVENTS).values(
        name=name, digest=digest, previous_digest=previous, at=at, note=note, details=details))


def put_alias(session: Executor, name: str, digest: str | None, *, at: datetime) -> None:
    """Make *name* point at *digest* (None: no alias) without touching its history."""
    session.execute(delete(ALIASES).where(ALIASES.c.name == name))
    if digest is not None:
        session.execute(insert(ALIASES).values(name=name, digest=digest, updated_at=at))


def set_alias(session: Executor, name: str, digest: str, note: str | None = None, *,
              details: dict[str, Any] | None = None, at: datetime | None = None,
              always: bool = False) -> str | None:
    """Point *name* at *digest*, record the move (with *note* and *details*, as of *at*) in
    the history, and return the digest it pointed at before (None when new). Pointing it
    where it already points changes nothing, unless *always* (then the history records it).
    A deleted artifact cannot be aliased (`ConflictError`)."""
    if row_id(session, digest, lock=False)[1] == "deleted":
        raise ConflictError(f"artifact {digest} is deleted; it cannot be aliased", what=digest)
    at = at or utcnow()
    locked = select(ALIASES.c.digest).where(ALIASES.c.name == name).with_for_update()
    previous: str | None = session.scalar(locked)
    if previous is None:
        stmt = insert_for(session, ALIASES).values(name=name, digest=digest, updated_at=at)
        if session.execute(stmt.on_conflict_do_nothing().returning(ALIASES.c.name)).first():
            insert_alias_event(session, name, digest, None, at=at, note=note, details=details)
            return None
        previous = session.scalar(locked)  # another writer created it meanwhile
    if previous == digest:
        if always:
            insert_alias_event(session, name, digest, previous, at=at, note=note,
                               details=details)
        return previous
    session.execute(
        update(ALIASES).where(ALIASES.c.name == name).values(digest=digest, updated_at=at)
    )
    insert_alias_event(session, name, digest, previous, at=at, note=note, details=details)
    return previous


def remove_alias(session: Executor, name: str, note: str | None = None, *,
                 at: datetime | None = None) -> str:
    """Remove *name* (history keeps an event with digest None); returns its last digest."""
    previous: str | None = session.scalar(
        delete(ALIASES).where(ALIASES.c.name == name).returning(ALIASES.c.digest))
    if previous is None:
        raise RecordNotFoundError("alias", name)
    insert_alias_event(session, name, None, previous, at=at or utcnow(), note=note)
    return previous


def get_alias(session: Executor, name: str) -> str | None:
    return session.scalar(select(ALIASES.c.digest).where(ALIASES.c.name == name))


def aliases_for(session: Executor, digest: str) -> list[str]:
    return sorted(session.scalars(select(ALIASES.c.name).where(ALIASES.c.digest == digest)))


def alias_history(session: Executor, name: str) -> list[AliasEvent]:
    """Every move of *name*, oldest first."""
    query = (
        select(ALIAS_EVENTS.c.name, ALIAS_EVENTS.c.digest, ALIAS_EVENTS.c.previous_digest,
               ALIAS_EVENTS.c.at, ALIAS_EVENTS.c.note, ALIAS_EVENTS.c.details)
        .where(ALIAS_EVENTS.c.name == name).order_by(ALIAS_EVENTS.c.id)
    )
    return [AliasEvent(*row) for row in session.execute(query)]


def pinned_by_rollback(session: Executor, alias: str) -> Pin | None:
    """The rollback that pins *alias* (`registry.sql.alias_pins.rollback_pin` decides)."""
    moves = alias_history(session, alias)
    return rollback_pin(alias, moves[-1] if moves else None, get_alias(session, alias))
