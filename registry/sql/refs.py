"""Resolving a ref (`registry.identity.refs`) against the SQL registry: the full digest a
digest prefix or an alias names, and the alias names for "did you mean"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.identity.refs import resolve_with

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def resolve_ref(session: Session, ref: str) -> str:
    """The full digest *ref* names, or RecordNotFoundError / UsageError."""
    from registry.sql import alias_records, records

    return resolve_with(ref, lambda prefix: records.find_by_prefix(session, prefix),
                        lambda name: alias_records.get_alias(session, name),
                        lambda: alias_names(session))


def alias_names(session: Session) -> list[str]:
    """Every alias name, for "did you mean"."""
    from sqlalchemy import select

    from registry.sql.models import Alias

    return sorted(session.scalars(select(Alias.name)))
