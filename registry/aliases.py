"""tag and untag: movable names (`llama70b/h100/prod`) for digests, with history kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry import records
from registry.refs import check_alias_name, resolve_ref

if TYPE_CHECKING:
    from registry.context import Context


def tag(ctx: Context, ref: str, alias: str, note: str | None = None) -> tuple[str, str | None]:
    """Point *alias* at the artifact *ref* names; returns (digest, previous digest)."""
    check_alias_name(alias)
    with ctx.registry.session() as session:
        digest = resolve_ref(session, ref)
        return digest, records.set_alias(session, alias, digest, note)


def untag(ctx: Context, alias: str) -> str:
    """Remove *alias*; returns the digest it pointed at."""
    with ctx.registry.session() as session:
        return records.remove_alias(session, alias)
