"""Opening the SQL registry: engines, Alembic migrations, the schema guard and sessions.

    reg = open_registry("sqlite:////home/me/.local/share/enginectl/registry.db")
    with reg.session() as session:            # one transaction: commit, or rollback on error
        records.add_artifact_if_absent(session, record)
    with reg.session(readonly=True) as session:
        records.list_artifacts(session, model="llama-8b")
    reg.close()

Schema policy (the schema belongs to `migrations/`, never to `metadata.create_all`):

- SQLite, the embedded default: created and migrated to head on open, under the database's
  write lock, so several processes opening a fresh file at once migrate it exactly once.
- PostgreSQL, the team setup: an empty database is migrated on open (under an advisory lock);
  one that is behind is refused with "run `enginectl db upgrade`", because older binaries may
  still share it and upgrading it is a deliberate act (`upgrade(url)`).
- A revision this binary does not know (a newer enginectl migrated it): opening and read-only
  sessions work, write sessions raise `SchemaError` ("... upgrade enginectl").

`open_registry(url, readonly=True)` is how commands that only read (ls, show, resolve, pull,
compare, logs) open it: it never creates a file or a folder, never creates or migrates a
table, and takes only read-only sessions. A registry that does not exist or has no tables is
`NoRegistryError` ("`enginectl db upgrade` creates it"); one behind this binary names
`enginectl db upgrade`, one ahead of it says to upgrade enginectl. SQLite is opened with
`mode=ro`, so not even a mistyped path is created.

SQLite runs in WAL mode with a 30 s busy timeout and foreign keys on; every write session
starts with `BEGIN IMMEDIATE`, so read-modify-write sequences are serialised across processes
instead of failing half-way with "database is locked". Hold one write session at a time.

A SQLite file is created whole (initialised beside its final name, then linked into place),
so an empty file is never one of ours: a zero-byte `registry.db` is refused, never silently
taken for a new registry (delete it to start one). A file that is not a database, or is
truncated or scrambled, is `DamagedRegistryError`: one line naming the file and
`enginectl reindex`, which rebuilds the registry from the store.

Errors: `IntegrityError` becomes `ConflictError`, `OperationalError` (unreachable, locked)
becomes `RegistryError`; both name the URL with its password hidden.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, OperationalError
from sqlalchemy.orm import ORMExecuteState, Session

from registry.errors import (
    ConflictError,
    DamagedRegistryError,
    NoRegistryError,
    RegistryError,
    SchemaError,
)
from registry.lookup import HEAD as LOOKUP_HEAD

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

SQLITE_BUSY_TIMEOUT_S: Final = 30
_READONLY: Final = "enginectl_readonly"
_PG_LOCK_ID: Final = 0x656E67696E6563  # "enginec": one advisory lock id for migrations

SchemaState = Literal["empty", "current", "behind", "newer"]

HEAD: Final = LOOKUP_HEAD
"""The newest migration in migrations/versions (written in `registry.lookup`, which reads
without SQLAlchemy). Alembic (a slow import) is only loaded when a database is not at HEAD;
tests check this constant against Alembic's own head."""


def migrations_dir() -> Path:
    """`migrations/` inside the installed package (wheel) or beside it (editable checkout)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise SchemaError(f"enginectl's migrations are missing (looked in {package}); reinstall it")


def _alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    """The newest schema revision this enginectl knows."""
    head = _script().get_current_head()
    if head is None:
        raise SchemaError("enginectl has no migrations; reinstall it")
    return head


def schema_state(revision: str | None) -> SchemaState:
    """Where a database at *revision* stands against this binary's migrations."""
    if revision is None:
        return "empty"
    if revision == HEAD or revision == head_revision():
        return "current"
    known = {script.revision for script in _script().walk_revisions()}
    return "behind" if revision in known else "newer"


def _schema_error(revision: str | None, state: SchemaState, url: str) -> SchemaError:
    head = head_revision()
    if state == "newer":
        message = (
            f"registry schema {revision} is newer than this enginectl (knows up to {head}); "
            "upgrade enginectl"
        )
    elif state == "behind":
        message = (
            f"registry schema {revision} is behind this enginectl (head {head}); "
            "run `enginectl db upgrade`"
        )
    else:
        message = f"registry {url} has no schema; run `enginectl db upgrade`"
    return SchemaError(message, revision=revision, head=head, url=url)


def safe_url(url: str | URL) -> str:
    """*url* with its password replaced by `***`, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable registry URL>"


@contextmanager
def _translating(url: str) -> Iterator[None]:
    try:
        yield
    except IntegrityError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else "constraint violated"
        raise ConflictError(f"registry {url} refused a conflicting write: {detail}") from exc
    except OperationalError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise RegistryError(f"cannot use registry {url}: {detail}") from exc
    except DatabaseError as exc:  # SQLite: "file is not a database", "disk image is malformed"
        lines = (str(exc.orig) if exc.orig else str(exc)).strip().splitlines()
        first = lines[0] if lines else type(exc).__name__
        path = _sqlite_file(make_url(url)) if url.startswith("sqlite") else None
        if path is not None:
            raise DamagedRegistryError(str(path), first) from exc
        raise RegistryError(f"cannot use registry {url}: {first}") from exc


def prepare_sqlite_file(path: Path) -> None:
    """Refuse an empty file (DamagedRegistryError); create a missing one whole, so that no
    process ever sees a registry file of ours empty (sqlite3 would create it empty and
    write its header only later)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    if size == 0:
        raise DamagedRegistryError(str(path))
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
    readonly = connection.get_execution_options().get(_READONLY, False)
    connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def _sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL; None for other databases and in-memory ones."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return None if database.startswith("file:") else Path(database).expanduser()


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine for *url* with enginectl's settings (also used by `migrations/env.py`).

    `postgresql://` and `postgres://` mean psycopg 3; SQLite gets its parent directory made,
    unless *readonly*: then a SQLite file that does not exist is `NoRegistryError` and the
    one that does is opened with `mode=ro` (nothing is created, not even its folder).
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise RegistryError(f"not a registry URL: {safe_url(url)!r} ({exc})") from exc
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_pre_ping=True)
    if backend != "sqlite":
        raise RegistryError(
            f"unsupported registry URL {safe_url(parsed)}: "
            "use sqlite:///path/registry.db or postgresql+psycopg://user@host/db"
        )
    path = _sqlite_file(parsed)
    if readonly:
        if path is None:
            raise RegistryError(f"registry {safe_url(parsed)} is not a SQLite file: nothing "
                                "to read")
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

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise NoRegistryError(safe_url(parsed), missing=True) from None
    except OSError as exc:
        raise RegistryError(f"cannot use registry {safe_url(parsed)}: "
                            f"{exc.strerror or exc}") from exc
    if size == 0:
        raise DamagedRegistryError(str(path))
    uri = f"{path.absolute().as_uri()}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S,
                               check_same_thread=False)

    engine = create_engine(parsed, creator=connect)
    event.listen(engine, "connect", _sqlite_on_connect_readonly)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _read_revision(connection: Connection) -> str | None:
    """The revision in alembic_version (None for a database without one), read with plain
    SQL so that opening a current registry never imports Alembic."""
    from sqlalchemy import inspect

    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaError(f"registry has {len(rows)} schema revisions {rows}; expected one")
    return rows[0] if rows else None


def _peek_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        connection.execution_options(**{_READONLY: True})
        return _read_revision(connection)


def _raw_pragma(connection: Connection, pragma: str) -> None:
    """Run a PRAGMA on the driver connection, outside any transaction SQLAlchemy would begin."""
    driver: Any = connection.connection.driver_connection  # sqlite3.Connection once checked out
    driver.execute(f"PRAGMA {pragma}")


def _migrate_if(engine: Engine, wanted: set[SchemaState]) -> str | None:
    """In one locked transaction: read the revision, migrate to head when its state is in
    *wanted*, and return the revision the database is at afterwards.

    On SQLite, batch migrations rebuild tables, which foreign keys would break; SQLite can
    only switch them off outside a transaction, so this does that on the raw connection,
    checks `PRAGMA foreign_key_check` before committing, and switches them on again.
    """
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            _raw_pragma(connection, "foreign_keys = OFF")
        try:
            with connection.begin():
                if not sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID}
                    )
                revision = _read_revision(connection)
                if schema_state(revision) not in wanted:
                    return revision
                from alembic import command

                command.upgrade(_alembic_config(connection), "head")
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise SchemaError(
                        f"migrating {safe_url(engine.url)} to {head_revision()} would break "
                        "foreign keys; nothing was changed"
                    )
                return head_revision()
        finally:
            if sqlite:
                _raw_pragma(connection, "foreign_keys = ON")


def current(url: str) -> str | None:
    """The database's schema revision, or None when it has none yet; reads only (a SQLite
    file that does not exist is not created, one that does is opened read-only)."""
    try:
        path = _sqlite_file(make_url(url))
    except ArgumentError:
        path = None  # make_engine explains
    if path is not None and not path.exists():
        return None
    engine = make_engine(url, readonly=path is not None)
    try:
        with _translating(safe_url(url)):
            return _peek_revision(engine)
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Migrate the database to this binary's head and return it; refuses a newer schema."""
    engine = make_engine(url)
    try:
        with _translating(safe_url(url)):
            revision = _migrate_if(engine, {"empty", "behind"})
        if schema_state(revision) != "current":
            raise _schema_error(revision, schema_state(revision), safe_url(url))
        return head_revision()
    finally:
        engine.dispose()


def _refuse_orm_writes(state: ORMExecuteState) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        raise RegistryError("write attempted in a read-only registry session")


def _refuse_flush(session: Session, _context: Any, _instances: Any) -> None:
    if session.new or session.dirty or session.deleted:
        raise RegistryError("write attempted in a read-only registry session")


class Registry:
    """An open registry: an engine plus the schema policy. Close it (or use `with`)."""

    def __init__(self, engine: Engine, url: str, *, readonly: bool = False) -> None:
        self._engine = engine
        self.url = url
        """The registry URL with its password hidden."""
        self.dialect: str = engine.dialect.name
        self.readonly = readonly
        """Opened for reading only (`open_registry(readonly=True)`): write sessions refused."""

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back when it raises.

        Write sessions (the default) first check the schema revision and refuse with
        `SchemaError` unless it is this binary's head. Read-only sessions skip that check,
        take no write lock on SQLite, and refuse writes.
        """
        if self.readonly and not readonly:
            raise RegistryError(f"write attempted on registry {self.url}, opened for reading")
        with _translating(self.url), self._engine.connect() as connection:
            connection.execution_options(**{_READONLY: readonly})
            if readonly and self.dialect == "postgresql":
                # BEGIN READ ONLY in one round trip; reset when the connection goes back
                connection.execution_options(postgresql_readonly=True)
            with Session(bind=connection, expire_on_commit=False) as session, session.begin():
                if readonly:
                    event.listen(session, "do_orm_execute", _refuse_orm_writes)
                    event.listen(session, "before_flush", _refuse_flush)
                else:
                    self._check_writable(session)
                yield session

    def _check_writable(self, session: Session) -> None:
        rows = session.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        revision = rows[0] if len(rows) == 1 else None
        state = schema_state(revision)
        if state != "current":
            raise _schema_error(revision, state, self.url)

    @contextmanager
    def gc_lock(self, *, shared: bool, blocking: bool = True) -> Iterator[bool]:
        """The registry's gc lock (`registry.gclock`): exclusive for gc's mark-and-sweep,
        shared for a publish's check-and-register. Yields whether it is held."""
        from registry import gclock

        with _translating(self.url), gclock.hold(self._engine, _sqlite_file(self._engine.url),
                                                 shared=shared, blocking=blocking) as held:
            yield held

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_registry(url: str, *, readonly: bool = False) -> Registry:
    """Open the registry at *url*, creating or migrating it as the module docstring says;
    with *readonly*, only an existing registry at this binary's schema, never changed."""
    if readonly:
        return _open_readonly(url)
    engine = make_engine(url)
    shown = safe_url(url)
    wanted: set[SchemaState] = {"empty", "behind"} if engine.dialect.name == "sqlite" else {"empty"}
    try:
        with _translating(shown):
            revision = _peek_revision(engine)
            if schema_state(revision) in wanted:
                revision = _migrate_if(engine, wanted)
    except BaseException:
        engine.dispose()
        raise
    state = schema_state(revision)
    if state in ("empty", "behind"):
        engine.dispose()
        raise _schema_error(revision, state, shown)
    return Registry(engine, shown)


def _open_readonly(url: str) -> Registry:
    engine = make_engine(url, readonly=True)
    shown = safe_url(url)
    try:
        with _translating(shown):
            revision = _peek_revision(engine)
        state = schema_state(revision)
    except BaseException:
        engine.dispose()
        raise
    if state != "current":
        engine.dispose()
        if state == "empty":
            raise NoRegistryError(shown, missing=False)
        raise _schema_error(revision, state, shown)
    return Registry(engine, shown, readonly=True)
