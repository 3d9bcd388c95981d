"""tag and untag: movable names (`llama70b/h100/prod`) for digests, with history kept (in
SQL and, as one record per move, in the store: `registry.history`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry import history, records
from registry.errors import UsageError
from registry.refs import check_alias_name, resolve_ref

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
    """Remove *alias*; returns the digest it pointed at."""
    with ctx.registry.session() as session:
        return history.remove_alias(ctx.store, session, alias)
