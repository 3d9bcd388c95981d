"""tag and untag: movable names (`llama70b/h100/prod`) for digests, with history kept (in
SQL and, as one record per move, in the store: `registry.history`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry import history, records
from registry.errors import RecordNotFoundError, UsageError, did_you_mean
from registry.refs import alias_names, check_alias_name, resolve_ref, unknown_alias

if TYPE_CHECKING:
    from registry.context import Context


def tag(
    ctx: Context, ref: str, alias: str, note: str | None = None, *, allow_unready: bool = False
) -> tuple[str, str | None]:
    """Point *alias* at the artifact *ref* names; returns (digest, previous digest).

    Aliases move only to `ready` artifacts (smoke-tested); *allow_unready* overrides that
    for an artifact that cannot be smoke-tested here, and the override is recorded in the
    alias history."""
    check_alias_name(alias)
    with ctx.registry.session() as session:
        digest = resolve_ref(session, ref)
        record = records.get_artifact(session, digest)
        status = record.status if record is not None else "unknown"
        if status != "ready":
            if not allow_unready or status in ("quarantined", "deleted"):
                raise UsageError(
                    f"artifact {digest[:19]}… is {status}, not ready: aliases move only to "
                    "smoke-tested artifacts"
                    + ("" if status in ("quarantined", "deleted")
                       else "; `enginectl smoke` it, or pass --allow-unready to override")
                )
            note = f"override: tagged while {status}" + (f"; {note}" if note else "")
        return digest, history.set_alias(ctx.store, session, alias, digest, note)


def untag(ctx: Context, alias: str) -> str:
    """Remove *alias*; returns the digest it pointed at. RecordNotFoundError (with the
    closest alias) when there is no such alias."""
    with ctx.registry.session() as session:
        if records.get_alias(session, alias) is None:
            raise unknown_alias("alias", alias, alias_names(session))
        return history.remove_alias(ctx.store, session, alias)


def rollback(ctx: Context, alias: str, note: str | None = None) -> tuple[str, str]:
    """Move *alias* back to the artifact it pointed at before its last move (its recorded
    history); returns (that digest, the digest it pointed at). The artifact it leaves
    becomes `superseded` when no other alias points at it (it no longer resolves), and the
    one it returns to, if superseded, `ready` again: it was proven before."""
    check_alias_name(alias)
    with ctx.registry.session() as session:
        current = records.get_alias(session, alias)
        if current is None:
            raise RecordNotFoundError("alias", alias, hint=(
                "it points nowhere, so there is nothing to roll back (`enginectl tag REF "
                f"ALIAS` sets it){did_you_mean(alias, alias_names(session))}"))
        moves = [e for e in records.alias_history(session, alias) if e.digest == current]
        before = moves[-1].previous_digest if moves else None
        if before is None:
            raise UsageError(f"alias {alias!r} has pointed only at {current[:19]}…; its "
                             "history has nothing to roll back to")
        status = records.get_status(session, before)
        if status in (None, "deleted", "quarantined"):
            raise UsageError(f"alias {alias!r} pointed at {before[:19]}… before, which is "
                             f"{status or 'not registered'}; tag another artifact instead")
        if status == "superseded":
            history.set_status(ctx.store, session, before, "ready", f"rollback of {alias}")
        history.set_alias(ctx.store, session, alias, before, note or "rollback",
                          details={"rollback": True, "from": current})
        if not records.aliases_for(session, current) \
                and records.get_status(session, current) == "ready":
            history.set_status(ctx.store, session, current, "superseded",
                               f"rolled back from as {alias}")
        return before, current
