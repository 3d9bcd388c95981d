"""Two statements every module of SQL records shares: an INSERT that can say ON CONFLICT on
the session's dialect, and an artifact's row id (optionally locked)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from registry.errors import RecordNotFoundError
from registry.sql.models import Artifact


def insert_for(session: Session, table: Table | type[Any]) -> Any:
    """INSERT with ON CONFLICT support on the session's dialect."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":  # imported here: neither dialect is needed to read
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def artifact_id(session: Session, digest: str, *, lock: bool | None = None) -> tuple[int, str]:
    """The artifact's row id and status; *lock* False/True takes a shared/exclusive row lock
    (PostgreSQL; SQLite write sessions are serialised already)."""
    query = select(Artifact.id, Artifact.status).where(Artifact.digest == digest)
    if lock is not None:
        query = query.with_for_update(read=not lock)
    row = session.execute(query).first()
    if row is None:
        raise RecordNotFoundError("artifact", digest, hint="see `enginectl ls`")
    return row.id, row.status


