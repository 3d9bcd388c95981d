"""The SQL registry: what is recorded about artifacts, in PostgreSQL or SQLite.

    db            opening a registry: `open_registry`, `Registry.session()`, the gc lock's entry
    engine        engines with enginectl's settings, SQLite files made whole, errors translated
    schema        Alembic migrations: the head, where a database stands, `upgrade`
    models        the ORM tables (they never leave this package)
    rows          small helpers over rows (an artifact's id, portable INSERT ... ON CONFLICT)
    records       artifacts and their files, as the plain dataclasses the rest of enginectl
                  reads and writes; the other subjects, the same way, one module each:
    alias_records, smoke_records, build_inputs (recipes, toolchains), nightly_runs
    leases, heartbeat, pending_publishes, gclock    rows with an expiry kept alive, and
                  the gc lock
    lookup        what fetch and plan read on the database driver alone, without SQLAlchemy:
                  `open_reader`, the driver's backend of the reads a session serves (refs)
    listing, showing    what `ls`, `info` and `show` read on that reader
    resolving     what `resolve` reads on it, in one statement; `held`: a reader kept open
                  across calls (`Context.reader`)
    evidence      which proof resolve ranks an artifact by (pure)
    alias_pins, refit_verdict    whether a rollback pins an alias, whether refit evidence
                  holds: pure decisions both roads share
    sqlite_file   when a registry's SQLite file is damaged: the one check both roads make
    transient, resilient    which connection faults are retried and for how long; the
                  PostgreSQL connection that retries them (SQLAlchemy's pool and lookup's)

Functions over a session (or a connection): none holds a `Context` or touches the store;
what writes the store and SQL together (history records, tag and rollback, a publish's
blobs in flight, a stage run's log) is `registry.ops`. May import `registry.errors`,
`registry.identity`, `registry.config` and the small top-level helpers (filelock, workers).
Never `registry.store`, `registry.context`, `registry.ops` or `pipeline`. `lookup`, `listing`,
`showing`, `resolving`, `held`, `evidence`, `alias_pins` and `refit_verdict` import no
SQLAlchemy, and importing this package imports nothing.
"""
