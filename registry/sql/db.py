"""Opening the SQL registry: engines, Alembic migrations, the schema guard and sessions.

    reg = open_registry("sqlite:////home/me/.local/share/enginectl/registry.db")
    with reg.session() as session:            # one transaction: commit, or rollback on error
        records.add_artifact_if_absent(session, record)
    with reg.session(readonly=True) as session:
        records.list_artifacts(session, model="llama-8b")
    with reg.connection() as connection:      # the same, on Core alone: no ORM imported
        records.add_artifact_if_absent(connection, record)
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

Blips: on PostgreSQL every statement, COMMIT and connect that meets a connection fault (reset,
refused, "server closed the connection unexpectedly") is retried on a new connection while
the leases this process holds have time left, else for *retry_s*
(`registry.sql.resilient`, `registry.sql.transient`), so a `with reg.session()` block needs
nothing of its own; a fault that outlasts that is `LeaseLostError` (naming the lease) or
`RegistryUnreachableError`.

Engines, the SQLite settings and the translation of errors are `registry.sql.engine`; the
migrations, `current` and `upgrade` are `registry.sql.schema`; this module opens a registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event, text

from registry.config import REGISTRY_RETRY_DEFAULT_S, masked_url
from registry.errors import NoRegistryError, RegistryError
from registry.sql.engine import READONLY, make_engine, sqlite_file, translating
from registry.sql.schema import SchemaState, migrate_if, peek_revision, schema_error, schema_state

if TYPE_CHECKING:
    from sqlalchemy.orm import ORMExecuteState, Session


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
        from sqlalchemy.orm import Session  # the ORM: only for a caller that wants one

        with self._connected(readonly) as connection, \
                Session(bind=connection, expire_on_commit=False) as session, session.begin():
            if readonly:
                event.listen(session, "do_orm_execute", _refuse_orm_writes)
                event.listen(session, "before_flush", _refuse_flush)
            else:
                self._check_writable(session)
            yield session

    @contextmanager
    def connection(self, *, readonly: bool = False) -> Iterator[Connection]:
        """One transaction on a Core connection, as `session()` makes one (a write one checks
        the schema first; committed when the block ends, rolled back when it raises), for
        the paths that must not import the ORM: a publish and its pending row, a renewal.
        The functions of `registry.sql` take either (`registry.sql.rows.Executor`). A
        *readonly* one takes no write lock on SQLite; it is for reads only."""
        with self._connected(readonly) as connection, connection.begin():
            if not readonly:
                self._check_writable(connection)
            yield connection

    @contextmanager
    def _connected(self, readonly: bool) -> Iterator[Connection]:
        if self.readonly and not readonly:
            raise RegistryError(f"write attempted on registry {self.url}, opened for reading")
        with translating(self.url), self._engine.connect() as connection:
            connection.execution_options(**{READONLY: readonly})
            if readonly and self.dialect == "postgresql":
                # BEGIN READ ONLY in one round trip; reset when the connection goes back
                connection.execution_options(postgresql_readonly=True)
            yield connection

    def _check_writable(self, session: Session | Connection) -> None:
        rows = session.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        revision = rows[0] if len(rows) == 1 else None
        state = schema_state(revision)
        if state != "current":
            raise schema_error(revision, state, self.url)

    @contextmanager
    def gc_lock(self, *, shared: bool, blocking: bool = True) -> Iterator[bool]:
        """The registry's gc lock (`registry.sql.gclock`): exclusive for gc's mark-and-sweep,
        shared for a publish's check-and-register. Yields whether it is held."""
        from registry.sql import gclock

        with translating(self.url), gclock.hold(self._engine, sqlite_file(self._engine.url),
                                                 shared=shared, blocking=blocking) as held:
            yield held

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_registry(url: str, *, readonly: bool = False,
                  retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> Registry:
    """Open the registry at *url*, creating or migrating it as the module docstring says;
    with *readonly*, only an existing registry at this binary's schema, never changed.
    *retry_s*: how long a call made while no lease is held retries a connection fault."""
    if readonly:
        return _open_readonly(url, retry_s)
    engine = make_engine(url, retry_s=retry_s)
    shown = masked_url(url)
    wanted: set[SchemaState] = {"empty", "behind"} if engine.dialect.name == "sqlite" else {"empty"}
    try:
        with translating(shown):
            revision = peek_revision(engine)
            if schema_state(revision) in wanted:
                revision = migrate_if(engine, wanted)
    except BaseException:
        engine.dispose()
        raise
    state = schema_state(revision)
    if state in ("empty", "behind"):
        engine.dispose()
        raise schema_error(revision, state, shown)
    return Registry(engine, shown)


def _open_readonly(url: str, retry_s: float) -> Registry:
    engine = make_engine(url, readonly=True, retry_s=retry_s)
    shown = masked_url(url)
    try:
        with translating(shown):
            revision = peek_revision(engine)
        state = schema_state(revision)
    except BaseException:
        engine.dispose()
        raise
    if state != "current":
        engine.dispose()
        if state == "empty":
            raise NoRegistryError(shown, missing=False)
        raise schema_error(revision, state, shown)
    return Registry(engine, shown, readonly=True)
