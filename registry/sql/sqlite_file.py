"""A registry's SQLite file, damaged: the one judgment of it that both roads into the
database make (the ORM's, `registry.sql.engine`, and the database driver's alone,
`registry.sql.lookup`). An empty file (0 bytes) is damaged, and so is one whose error says
the file itself is bad; a lock, a missing table or a refused write is not. No SQLAlchemy."""

from __future__ import annotations

from pathlib import Path

from registry.errors import DamagedRegistryError


def refuse_empty(path: Path, size: int | None) -> None:
    """DamagedRegistryError when the file at *path* is *size* 0 bytes (None: there is none);
    sqlite3 would take it for a new database and write into it."""
    if size == 0:
        raise DamagedRegistryError(str(path))


def damaged(path: Path, exc: BaseException | None) -> DamagedRegistryError | None:
    """DamagedRegistryError for the SQLite file at *path* when *exc* (a sqlite3 error, as
    the driver raises it or as SQLAlchemy carries it in `.orig`) says the file itself is bad
    (not a database, malformed), not a lock, a missing table or a refused write; None
    otherwise."""
    import sqlite3

    if not isinstance(exc, sqlite3.DatabaseError) \
            or isinstance(exc, sqlite3.OperationalError | sqlite3.IntegrityError):
        return None
    lines = str(exc).strip().splitlines()
    return DamagedRegistryError(str(path), lines[0] if lines else type(exc).__name__)
