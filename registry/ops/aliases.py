"""tag, untag and rollback: movable names (`llama70b/h100/prod`) for digests, with history
kept (in SQL and, as one record per move, in the store: `registry.ops.history`).

A rollback is sticky: while an alias's last move is a rollback, it is *pinned*
(`registry.sql.alias_records.pinned_by_rollback`, read from that history, so `reindex`
restores it with the rest). Only a `tag` by hand (which clears the pin) or a new digest
that wins the nightly's gate against the artifact rolled back to moves it; a build never
does, and the digest it left never comes back by itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.errors import RecordNotFoundError, UsageError, did_you_mean
from registry.identity.refs import check_alias_name, unknown_alias
from registry.ops import history
from registry.sql import alias_records, records
from registry.sql.alias_records import pinned_by_rollback
from registry.sql.refs import alias_names, resolve_ref

if TYPE_CHECKING:
    from registry.context import Context


def tag(
    ctx: Context, ref: str, alias: str, note: str | None = None, *, allow_unready: bool = False
) -> tuple[str, str | None]:
    """Point *alias* at the artifact *ref* names; returns (digest, previous digest).

    Aliases move only to `ready` artifacts (smoke-tested; a `superseded` one is ready
    again, as a rollback makes it); *allow_unready* overrides that
    for an artifact that cannot be smoke-tested here, and the override is recorded in the
    alias history. A tag clears a rollback's pin, also when it names the digest the alias
    already points at (that is recorded as a move too)."""
    check_alias_name(alias)
    with ctx.registry.session() as session:
        digest = resolve_ref(session, ref)
        record = records.get_artifact(session, digest)
        status = record.status if record is not None else "unknown"
        if status == "superseded":  # proven once: by hand it is live again, as a rollback
            history.set_status_and_record(ctx.store, session, digest, "ready", f"tagged as {alias}")
        elif status != "ready":
            if not allow_unready or status in ("quarantined", "deleted"):
                raise UsageError(
                    f"artifact {digest[:19]}… is {status}, not ready: aliases move only to "
                    "smoke-tested artifacts"
                    + ("" if status in ("quarantined", "deleted")
                       else "; `enginectl smoke` it, or pass --allow-unready to override")
                )
            note = f"override: tagged while {status}" + (f"; {note}" if note else "")
        pinned = pinned_by_rollback(session, alias) is not None
        return digest, history.set_alias_and_record(ctx.store, session, alias, digest, note,
                                                    always=pinned)


def untag(ctx: Context, alias: str) -> str:
    """Remove *alias*; returns the digest it pointed at. RecordNotFoundError (with the
    closest alias) when there is no such alias."""
    with ctx.registry.session() as session:
        if alias_records.get_alias(session, alias) is None:
            raise unknown_alias("alias", alias, alias_names(session))
        return history.remove_alias_and_record(ctx.store, session, alias)


def rollback(ctx: Context, alias: str, note: str | None = None) -> tuple[str, str]:
    """Move *alias* back to the artifact it pointed at before its last move (its recorded
    history), with *note* as the reason; returns (that digest, the digest it pointed at).
    The artifact it leaves becomes `superseded` when no other alias points at it (it no
    longer resolves), and the one it returns to, if superseded, `ready` again: it was
    proven before. The alias stays pinned there (module doc) until a tag or a gate win."""
    check_alias_name(alias)
    with ctx.registry.session() as session:
        current = alias_records.get_alias(session, alias)
        if current is None:
            raise RecordNotFoundError("alias", alias, hint=(
                "it points nowhere, so there is nothing to roll back (`enginectl tag REF "
                f"ALIAS` sets it){did_you_mean(alias, alias_names(session))}"))
        moves = [e for e in alias_records.alias_history(session, alias) if e.digest == current]
        before = moves[-1].previous_digest if moves else None
        if before is None:
            raise UsageError(f"alias {alias!r} has pointed only at {current[:19]}…; its "
                             "history has nothing to roll back to")
        status = records.get_status(session, before)
        if status in (None, "deleted", "quarantined"):
            raise UsageError(f"alias {alias!r} pointed at {before[:19]}… before, which is "
                             f"{status or 'not registered'}; tag another artifact instead")
        if status == "superseded":
            history.set_status_and_record(ctx.store, session, before, "ready",
                                          f"rollback of {alias}")
        history.set_alias_and_record(ctx.store, session, alias, before, note,
                                     details={"rollback": True, "from": current})
        if not alias_records.aliases_for(session, current) \
                and records.get_status(session, current) == "ready":
            history.set_status_and_record(ctx.store, session, current, "superseded",
                                          f"rolled back from as {alias}")
        return before, current
