"""Resolving a ref (`registry.identity.refs`) against the SQL registry: the full digest a
digest prefix or an alias names, and the alias names for "did you mean"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.identity.refs import resolve_with

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class SessionReader:
    """`registry.identity.refs.RefReader` over a session of the ORM."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def find_by_prefix(self, hex_prefix: str) -> list[str]:
        from registry.sql.records import find_by_prefix

        return find_by_prefix(self.session, hex_prefix)

    def get_alias(self, name: str) -> str | None:
        from registry.sql.alias_records import get_alias

        return get_alias(self.session, name)

    def alias_names(self) -> list[str]:
        return alias_names(self.session)


def resolve_ref(session: Session, ref: str) -> str:
    """The full digest *ref* names, or RecordNotFoundError / UsageError."""
    return resolve_with(ref, SessionReader(session))


def alias_names(session: Session) -> list[str]:
    """Every alias name, for "did you mean"."""
    from sqlalchemy import select

    from registry.sql.models import Alias

    return sorted(session.scalars(select(Alias.name)))
