"""SQL engines with enginectl's settings, and SQLAlchemy's errors in enginectl's words.

`make_engine(url)`: psycopg 3 for `postgresql://`; SQLite in WAL mode with a 30 s busy timeout,
foreign keys on and `BEGIN IMMEDIATE` for every write transaction, its file created whole
(`prepare_sqlite_file`), or opened with `mode=ro` when *readonly*. `translating(url)` turns
`IntegrityError` into `ConflictError`, `OperationalError` into `RegistryError` (a connection
fault that outlasted its retries into `LeaseLostError` or `RegistryUnreachableError`) and a SQLite
file that is not a database into `DamagedRegistryError`. How a registry is opened on top of
these: `registry.sql.db`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, OperationalError

from registry.config import REGISTRY_RETRY_DEFAULT_S, masked_url
from registry.errors import ConflictError, NoRegistryError, RegistryError
from registry.sql.sqlite_file import damaged, refuse_empty
from registry.sql.transient import unreachable

SQLITE_BUSY_TIMEOUT_S: Final = 30
READONLY: Final = "enginectl_readonly"
"""The execution option that marks a connection's transactions read-only (SQLite: `BEGIN`)."""



@contextmanager
def translating(url: str) -> Iterator[None]:
    try:
        yield
    except IntegrityError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else "constraint violated"
        raise ConflictError(f"registry {url} refused a conflicting write: {detail}") from exc
    except OperationalError as exc:
        lost = unreachable(url, exc)
        if lost is not None:
            raise lost from exc
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise RegistryError(f"cannot use registry {url}: {detail}") from exc
    except DatabaseError as exc:  # SQLite: "file is not a database", "disk image is malformed"
        path = sqlite_file(make_url(url)) if url.startswith("sqlite") else None
        bad = damaged(path, exc.orig) if path is not None else None
        if bad is not None:
            raise bad from exc
        lines = (str(exc.orig) if exc.orig else str(exc)).strip().splitlines()
        raise RegistryError(f"cannot use registry {url}: "
                            f"{lines[0] if lines else type(exc).__name__}") from exc


def prepare_sqlite_file(path: Path) -> None:
    """Refuse an empty file (DamagedRegistryError); create a missing one whole, so that no
    process ever sees a registry file of ours empty (sqlite3 would create it empty and
    write its header only later)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    refuse_empty(path, size)
    if size is not None:
        return
    import sqlite3
    import uuid

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RegistryError(f"cannot create the registry's folder {path.parent}: "
                            f"{exc.strerror or exc}") from exc
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.new")
    try:
        with contextlib.closing(sqlite3.connect(temp)) as connection:
            connection.execute("PRAGMA journal_mode = WAL")  # writes the header: not empty
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(temp, path)
    except OSError as exc:
        raise RegistryError(f"cannot create registry file {path}: {exc.strerror or exc}"
                            ) from exc
    finally:
        for leftover in (temp, temp.with_name(f"{temp.name}-wal"),
                         temp.with_name(f"{temp.name}-shm")):
            leftover.unlink(missing_ok=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event own transactions (pysqlite's implicit BEGIN is off).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _sqlite_on_connect_readonly(dbapi_connection: Any, _record: Any) -> None:
    # A `mode=ro` connection: no journal mode to set (that would be a write).
    dbapi_connection.isolation_level = None
    dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")


def _sqlite_on_begin(connection: Connection) -> None:
    readonly = connection.get_execution_options().get(READONLY, False)
    connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL; None for other databases and in-memory ones."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return None if database.startswith("file:") else Path(database).expanduser()


def _resilient_connect(retry_s: float) -> Any:
    """The pool's connect: a psycopg connection that retries through blips
    (`registry.sql.resilient`), made with the dialect's own arguments."""
    from registry.sql.resilient import ResilientConnection

    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> ResilientConnection:
        return ResilientConnection(lambda: dialect.loaded_dbapi.connect(*cargs, **cparams),
                                   window_s=retry_s)
    return connect


def make_engine(url: str, *, readonly: bool = False,
                retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> Engine:
    """An engine for *url* with enginectl's settings (also used by `migrations/env.py`).

    `postgresql://` and `postgres://` mean psycopg 3, over connections that retry a blip
    while the leases this process holds have time left, else for *retry_s*
    (`registry.sql.resilient`; pool_pre_ping then only finds a pooled connection the
    server ended, which the retry replaces the same way); SQLite gets its parent directory made,
    unless *readonly*: then a SQLite file that does not exist is `NoRegistryError` and the
    one that does is opened with `mode=ro` (nothing is created, not even its folder).
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise RegistryError(f"not a registry URL: {masked_url(url)!r} ({exc})") from exc
    backend = parsed.get_backend_name()
    shown_url = masked_url(parsed.render_as_string(hide_password=False))
    if backend in ("postgresql", "postgres"):
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        engine = create_engine(parsed, pool_pre_ping=True, use_native_hstore=False)
        event.listen(engine, "do_connect", _resilient_connect(retry_s))
        return engine
    if backend != "sqlite":
        raise RegistryError(
            f"unsupported registry URL {shown_url}: "
            "use sqlite:///path/registry.db or postgresql+psycopg://user@host/db"
        )
    path = sqlite_file(parsed)
    if readonly:
        if path is None:
            raise RegistryError(f"registry {shown_url} is not a SQLite file: nothing to read")
        return _readonly_sqlite_engine(parsed, path)
    if path is not None:
        prepare_sqlite_file(path)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _readonly_sqlite_engine(parsed: URL, path: Path) -> Engine:
    """An engine on the existing SQLite file *path* that cannot create or write it."""
    import sqlite3

    shown_url = masked_url(parsed.render_as_string(hide_password=False))
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise NoRegistryError(shown_url, missing=True) from None
    except OSError as exc:
        raise RegistryError(f"cannot use registry {shown_url}: "
                            f"{exc.strerror or exc}") from exc
    refuse_empty(path, size)
    uri = f"{path.absolute().as_uri()}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S,
                               check_same_thread=False)

    engine = create_engine(parsed, creator=connect)
    event.listen(engine, "connect", _sqlite_on_connect_readonly)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine
