"""The gc lock: gc sweeps alone; a publish's last step (its blobs are there, then its row)
never runs while a sweep does.

    exclusive   gc, for its whole mark-and-sweep
    shared      a publish (or a stage log, a smoke log) while it checks that every blob it
                relies on is in the store, puts back any that are gone, and commits the row
                that references them; many at once

One lock per registry, so it covers every machine that shares the registry and the store:

- PostgreSQL: a session-level advisory lock (`pg_advisory_lock` / `pg_advisory_lock_shared`)
  keyed by the registry's schema (`SCHEMA_KEY`), on a connection of its own, held while the
  block runs and released by `pg_advisory_unlock*` (or by the server when that connection
  dies with its process). The
  registering transaction itself stays short: it does no store I/O.
- SQLite (one machine only, like the file): `registry.filelock.flock` on
  `<registry file>.gc-lock` beside the database; the kernel drops it when the process dies.

`blocking=False` answers False at once instead of waiting (tests use it to show who holds
the lock).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sqlalchemy import Engine, text

from registry.filelock import flock
from registry.sql.transient import is_transient

GC_LOCK_ID: Final = 0x656E67696E6567  # "engineg": distinct from the migrations' lock id
SCHEMA_KEY: Final = "SELECT hashtextextended(coalesce(current_schema(), ''), :seed)"
"""The advisory lock key of this registry: advisory locks are per database, and registries in
two schemas of one database (one per team or environment) must not wait for each other's gc."""


def lock_path(database: Path) -> Path:
    return database.with_name(f"{database.name}.gc-lock")


@contextlib.contextmanager
def hold(engine: Engine, database: Path | None, *, shared: bool,
         blocking: bool = True) -> Iterator[bool]:
    """Hold the gc lock of the registry behind *engine* (*database*: its SQLite file, None
    for PostgreSQL or an in-memory SQLite, which has no other process to exclude). Yields
    whether it is held: always True when *blocking*."""
    if engine.dialect.name == "postgresql":
        with _advisory(engine, shared=shared, blocking=blocking) as held:
            yield held
    elif database is not None:
        with flock(lock_path(database), shared=shared, blocking=blocking) as held:
            yield held
    else:
        yield True


@contextlib.contextmanager
def _advisory(engine: Engine, *, shared: bool, blocking: bool) -> Iterator[bool]:
    suffix = "_shared" if shared else ""
    take = f"pg_{'' if blocking else 'try_'}advisory_lock{suffix}"
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    held = False
    try:
        key = connection.execute(text(SCHEMA_KEY), {"seed": GC_LOCK_ID}).scalar()
        answer = connection.execute(text(f"SELECT {take}(:key)"), {"key": key}).scalar()
        held = True if blocking else bool(answer)  # pg_advisory_lock* returns void
        yield held
    finally:
        try:
            if held:
                connection.execute(text(f"SELECT pg_advisory_unlock{suffix}(:key)"),
                                   {"key": key})
        except Exception as exc:
            connection.invalidate()  # closing the connection releases the lock for good
            if not is_transient(exc):
                raise  # else the server released it already, with the connection it lost
        finally:
            connection.close()
