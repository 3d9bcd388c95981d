"""Two statements every module of SQL records shares: an INSERT that can say ON CONFLICT on
the session's dialect, and an artifact's row id (optionally locked); and `Executor`, what
their functions run on: an ORM `Session` or a Core `Connection` (`Registry.connection`, for
the paths that must not import the ORM, such as a publish). The statements are Core over
`registry.sql.tables`, the same on both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import Connection, Table, select

from registry.errors import RecordNotFoundError
from registry.sql.tables import ARTIFACTS

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    Executor: TypeAlias = Connection | Session


def dialect_of(session: Executor) -> str:
    """"postgresql" or "sqlite": the database a session or a connection is on."""
    bind = session if isinstance(session, Connection) else session.get_bind()
    return bind.dialect.name


def insert_for(session: Executor, table: Table | type[Any]) -> Any:
    """INSERT with ON CONFLICT support on the session's dialect."""
    if dialect_of(session) == "postgresql":  # imported here: neither dialect is needed to read
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def artifact_id(session: Executor, digest: str, *, lock: bool | None = None) -> tuple[int, str]:
    """The artifact's row id and status; *lock* False/True takes a shared/exclusive row lock
    (PostgreSQL; SQLite write sessions are serialised already)."""
    query = select(ARTIFACTS.c.id, ARTIFACTS.c.status).where(ARTIFACTS.c.digest == digest)
    if lock is not None:
        query = query.with_for_update(read=not lock)
    row = session.execute(query).first()
    if row is None:
        raise RecordNotFoundError("artifact", digest, hint="see `enginectl ls`")
    return row.id, row.status


