"""Alembic environment for the enginectl registry.

Run programmatically by `registry.sql.schema` (which hands its own connection in through
`config.attributes["connection"]`, inside a transaction it holds and commits), or by the
`alembic` CLI from the repository root for development (`alembic revision --autogenerate`),
which uses `sqlalchemy.url` from alembic.ini when set, else ENGINECTL_REGISTRY_URL / the
default SQLite file. Upgrade real SQLite registries through `registry.sql.schema.upgrade` instead:
it switches foreign keys off around batch table rebuilds, which the plain CLI path does not.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

from registry.config import RegistryConfig
from registry.sql.engine import make_engine
from registry.sql.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or RegistryConfig.from_env().registry_url


def _render_item(kind: str, item: Any, _context: AutogenContext) -> str | Literal[False]:
    """Autogenerate writes our UTC type as the plain type it is in the database, so that
    revisions never import `registry.sql.models`."""
    if kind == "type" and isinstance(item, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transactional_ddl=True,
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=_url().startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as fresh:
            _run(fresh)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
