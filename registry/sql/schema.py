"""The schema: Alembic's migrations, where a database stands against them, and `upgrade`.

The schema belongs to `migrations/`, never to `metadata.create_all`. Alembic (a slow import) is
loaded only when a database is not at `HEAD`; a current one is recognised with plain SQL.
Migrating runs in one locked transaction (PostgreSQL: an advisory lock; SQLite: its write
lock), so processes opening a fresh database at once migrate it exactly once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from registry.config import REGISTRY_RETRY_DEFAULT_S, masked_url
from registry.errors import SchemaError
from registry.sql.engine import READONLY, make_engine, sqlite_file, translating
from registry.sql.gclock import SCHEMA_KEY
from registry.sql.lookup import HEAD as LOOKUP_HEAD

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

_PG_LOCK_ID: Final = 0x656E67696E6563  # "enginec": one advisory lock id for migrations

SchemaState = Literal["empty", "current", "behind", "newer"]

HEAD: Final = LOOKUP_HEAD
"""The newest migration in migrations/versions (written in `registry.sql.lookup`, which reads
without SQLAlchemy). Alembic (a slow import) is only loaded when a database is not at HEAD;
tests check this constant against Alembic's own head."""


def migrations_dir() -> Path:
    """`migrations/` inside the installed package (wheel: `registry/migrations`) or beside it
    (editable checkout: the repository's `migrations/`)."""
    package = Path(__file__).resolve().parents[1]  # registry/, this file being registry/sql/
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


def schema_error(revision: str | None, state: SchemaState, url: str) -> SchemaError:
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


def peek_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        connection.execution_options(**{READONLY: True})
        return _read_revision(connection)


def _raw_pragma(connection: Connection, pragma: str) -> None:
    """Run a PRAGMA on the driver connection, outside any transaction SQLAlchemy would begin."""
    driver: Any = connection.connection.driver_connection  # sqlite3.Connection once checked out
    driver.execute(f"PRAGMA {pragma}")


def migrate_if(engine: Engine, wanted: set[SchemaState]) -> str | None:
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
                    key = f"({SCHEMA_KEY})"  # per schema, as the gc lock's
                    connection.execute(text(f"SELECT pg_advisory_xact_lock({key})"),
                                       {"seed": _PG_LOCK_ID})
                revision = _read_revision(connection)
                if schema_state(revision) not in wanted:
                    return revision
                from alembic import command

                command.upgrade(_alembic_config(connection), "head")
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise SchemaError(
                        f"migrating {masked_url(engine.url.render_as_string(hide_password=False))}"
                        f" to {head_revision()} would break foreign keys; nothing was changed"
                    )
                return head_revision()
        finally:
            if sqlite:
                _raw_pragma(connection, "foreign_keys = ON")


def current(url: str, *, retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> str | None:
    """The database's schema revision, or None when it has none yet; reads only (a SQLite
    file that does not exist is not created, one that does is opened read-only). A
    connection fault is retried for *retry_s* (`registry.sql.transient`)."""
    try:
        path = sqlite_file(make_url(url))
    except ArgumentError:
        path = None  # make_engine explains
    if path is not None and not path.exists():
        return None
    engine = make_engine(url, readonly=path is not None, retry_s=retry_s)
    try:
        with translating(masked_url(url)):
            return peek_revision(engine)
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Migrate the database to this binary's head and return it; refuses a newer schema."""
    engine = make_engine(url)
    try:
        with translating(masked_url(url)):
            revision = migrate_if(engine, {"empty", "behind"})
        if schema_state(revision) != "current":
            raise schema_error(revision, schema_state(revision), masked_url(url))
        return head_revision()
    finally:
        engine.dispose()

