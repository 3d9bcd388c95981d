"""The SQL registry: what is recorded about artifacts, in PostgreSQL or SQLite.

    db            opening a registry: `open_registry`, `Registry.session()`, the gc lock's entry
    engine        engines with enginectl's settings, SQLite files made whole, errors translated
    schema        Alembic migrations: the head, where a database stands, `upgrade`
    models        the ORM tables (they never leave this package)
    rows          small helpers over rows (an artifact's id, portable INSERT ... ON CONFLICT)
    records       artifacts and their files, as the plain dataclasses the rest of enginectl
                  reads and writes; the other subjects, the same way, one module each:
    alias_records, smoke_records, evidence, build_inputs (recipes, toolchains), nightly_runs
    aliases       a user's tag and untag: name checks, then history
    history       status changes, smoke reports and alias moves: store record, then SQL row
    leases, heartbeat, pending, gclock    rows with an expiry kept alive, and the gc lock
    lookup        what fetch and plan read on the database driver alone, without SQLAlchemy
    transient, resilient    which connection faults are retried and for how long; the
                  PostgreSQL connection that retries them (SQLAlchemy's pool and lookup's)

May import: `registry.errors`, `registry.identity`, the store's interface (`registry.store.base`)
and the registry's top-level helpers (config, context, progress, workers). Never the store
backends, `registry.ops` or `pipeline`. `lookup` imports no SQLAlchemy, and importing this
package imports nothing.
"""
