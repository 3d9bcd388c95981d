"""What `fetch` reads from the registry, on the database driver alone (sqlite3 or psycopg).

A deploy node runs `enginectl fetch` more than anything else, and importing SQLAlchemy's ORM
costs ~0.35 s here: more than a whole cache-hit fetch of 2 GiB, and half of a `file://`
fetch's budget next to `cp -r`. The three reads a fetch needs (an alias, the digests with a
prefix, an artifact's status and its reason) are plain SELECTs on two tables whose columns
have not changed since the first schema, so they run here without SQLAlchemy, under the
same rules as `registry.identity.refs` (which this shares). `plan` reads the same way which of its
keys are built and the toolchains last probed on the pools (`built_keys`, `last_toolchain`,
`recorded_pools`),
and `build` what a fully cached build needs to know (`build_state`): it reads those only
from a registry at the schema head (`HEAD`), and leaves any other to `registry.sql.db`.

On PostgreSQL a read that meets a connection fault is retried (`registry.sql.resilient`).
Reads only: nothing here creates or migrates a registry. A SQLite file that does not exist,
or has no tables yet, is a registry with no artifacts (a plan builds everything; a full
digest is fetched from the store alone), except that an alias or a digest prefix looked up
in it is `NoRegistryError`, which names the command that creates one; a file that is empty
(0 bytes), not a database, truncated or scrambled is `DamagedRegistryError`, judged by
`registry.sql.sqlite_file` as the ORM's road judges it.

`open_reader` is the one driver-only road (`listing`, `warm_lookup`, `alias_targets` too);
its `DriverReader` serves the reads a session serves (`registry.identity.refs.RefReader`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit, urlunsplit

from registry.config import REGISTRY_RETRY_DEFAULT_S, masked_url
from registry.errors import (
    NoRegistryError,
    RecordNotFoundError,
    RegistryError,
)
from registry.identity.refs import resolve_with
from registry.sql.sqlite_file import damaged, refuse_empty
from registry.sql.transient import unreachable

HEAD: Final = "0004"
"""The Alembic revision of the newest schema (`registry.sql.schema` reads it from here, so
that it is known without importing SQLAlchemy); tests check it against Alembic's own head."""


@dataclass(frozen=True)
class Found:
    digest: str
    status: str | None
    """None when the registry does not list the digest (a full digest fetched from the store)."""
    reason: str | None = None
    """Why it has that status (`smoke failed: …`), when the registry says."""


def lookup(url: str, ref: str, *, retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> Found:
    """The artifact *ref* (digest, unique prefix or alias) names in the registry at *url*.

    RecordNotFoundError / UsageError as `registry.sql.refs.resolve_ref` raises them;
    NoRegistryError for an alias or a prefix when there is no registry at *url*."""
    with open_reader(url, retry_s) as reader:
        try:
            digest = resolve_with(ref, reader)
        except RecordNotFoundError as exc:
            full = re.fullmatch(r"sha256:[0-9a-f]{64}", ref) is not None
            if reader.absent is None or full:  # a full digest may still be in the store
                raise
            raise NoRegistryError(masked_url(url), missing=reader.absent == "file") from exc
        return Found(digest, *reader.status(digest))


@dataclass(frozen=True)
class Probed:
    """A pool's last recorded toolchain probe."""

    fingerprint: dict[str, Any]
    host: str
    probed_at: str
    pool: str = ""
    gpu: str = "CPU"  # the SKU probed there ("CPU": none)
    node_id: str | None = None  # the Ray node probed (None off Ray)


def built_keys(url: str, keys: set[str]) -> set[str]:
    """Which of *keys* are done in the registry at *url*: mapped to a reusable artifact (not
    deleted or quarantined, as `records.find_by_keys` decides), or, for a smoke run, which
    makes no artifact of its own, passed on an artifact that is ready."""
    with open_reader(url) as reader:
        return reader.built_keys(keys)


def last_toolchain(url: str, pool: str) -> Probed | None:
    """The newest toolchain recorded for *pool* in the registry at *url*, if any."""
    with open_reader(url) as reader:
        return reader.last_toolchain(pool)


def recorded_pools(url: str) -> list[Probed]:
    """What `plan` picks each target's fingerprint from, in the registry at *url*: every
    pool's last probing (each node a Ray build probed together, with one time) and each host
    pool's newest probe of every GPU it has reported, newest first; [] without a registry."""
    with open_reader(url) as reader:
        return reader.recorded_pools()


@dataclass(frozen=True)
class Reusable:
    """The newest artifact built for a key that can be reused (not deleted or quarantined)."""

    digest: str
    status: str
    reason: str | None


@dataclass(frozen=True)
class PastRun:
    """A key's stage-run row: how it ended and how long it took (None: never finished)."""

    status: str
    seconds: float | None


@dataclass(frozen=True)
class BuildState:
    """What a fully cached build reads: for its keys, the artifacts and stage runs; whether
    its recipe text is stored; its pool's last probe. `current` is False (and the rest
    empty) for a registry that is not at `HEAD`, or has no tables yet."""

    current: bool
    artifacts: dict[str, Reusable] = field(default_factory=dict)
    runs: dict[str, PastRun] = field(default_factory=dict)
    recipe_stored: bool = False
    latest_recipe: tuple[str, str | None] | None = None
    """(digest, path) of the recipe of this name last built (what a nightly takes)."""
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)
    """For each alias asked about that points somewhere: (digest, that artifact's status)."""
    probe: Probed | None = None


def build_state(url: str, keys: set[str], *, recipe: str, pool: str, name: str = "",
                aliases: Iterable[str] = ()) -> BuildState:
    """`BuildState` of *keys*, of the recipe whose digest is *recipe* (and the one of *name*
    last built), of *aliases* and of *pool*, read from the registry at *url* in one
    connection (`records.find_by_keys`, `leases.get_stage_runs`, `build_inputs`'
    `recorded_recipes` and `toolchain_history`, and `alias_records.get_alias`, all in
    `registry.sql`, answer the same through the ORM)."""
    with open_reader(url) as reader:
        if reader.revision() != HEAD:
            return BuildState(current=False)
        latest = reader.rows("SELECT digest, path FROM recipes WHERE name = ? AND path IS NOT "
                             "NULL AND last_used_at IS NOT NULL ORDER BY last_used_at DESC, "
                             "digest DESC LIMIT 1", name)
        pointed = {}
        for alias in sorted(aliases):
            rows = reader.rows("SELECT a.digest, r.status FROM aliases a JOIN artifacts r ON "
                               "r.digest = a.digest WHERE a.name = ?", alias)
            if rows:
                pointed[alias] = (str(rows[0][0]), str(rows[0][1]))
        return BuildState(
            current=True, artifacts=reader.reusable(keys), runs=reader.past_runs(keys),
            recipe_stored=bool(reader.rows("SELECT 1 FROM recipes WHERE digest = ?", recipe)),
            latest_recipe=(str(latest[0][0]), latest[0][1]) if latest else None,
            aliases=pointed, probe=reader.last_toolchain(pool))


def json_column(value: Any) -> dict[str, Any]:
    """A JSON column's value: SQLite keeps JSON as text, psycopg hands back the object; {}
    for NULL."""
    if value is None:
        return {}
    return dict(json.loads(value) if isinstance(value, str | bytes) else value)


def _seconds(started: Any, finished: Any) -> float | None:
    """*finished* - *started* in seconds: datetimes from psycopg, ISO text from SQLite."""
    if started is None or finished is None:
        return None
    if isinstance(started, str):
        started, finished = datetime.fromisoformat(started), datetime.fromisoformat(finished)
    seconds: float = (finished - started).total_seconds()
    return seconds


class DriverReader:
    """The registry's reads over a DB-API connection (sqlite3 or psycopg): what fetch, plan
    and a no-op build ask, and `registry.identity.refs.RefReader`; *connection* is None for
    a registry with no tables yet (nothing is registered): *absent* then says why ("file" or
    "tables")."""

    def __init__(self, connection: Any, placeholder: str, absent: str | None = None) -> None:
        self._connection = connection
        self._placeholder = placeholder
        self.dialect = "sqlite" if placeholder == "?" else "postgresql"
        self.absent = absent if connection is None else None

    def rows(self, sql: str, *values: str) -> list[tuple[Any, ...]]:
        if self._connection is None:
            return []
        cursor = self._connection.cursor()
        try:
            cursor.execute(sql.replace("?", self._placeholder), values)
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def _chunked(self, sql: str, keys: set[str]) -> Iterator[tuple[Any, ...]]:
        """The rows of *sql* (with `{marks}` for an IN list) over *keys*, 500 at a time to
        bound the parameters of one statement; only "?" marks are formatted in, never a
        value."""
        ordered = sorted(keys)
        for first in range(0, len(ordered), 500):
            chunk = ordered[first:first + 500]
            yield from self.rows(sql.format(marks=", ".join("?" * len(chunk))), *chunk)

    def revision(self) -> str | None:
        if self._connection is None or not self._has_table("alembic_version"):
            return None
        rows = self.rows("SELECT version_num FROM alembic_version")
        return str(rows[0][0]) if len(rows) == 1 else None

    def reusable(self, keys: set[str]) -> dict[str, Reusable]:
        found: dict[str, Reusable] = {}
        for key, digest, status, reason in self._chunked(
                "SELECT key, digest, status, status_reason FROM artifacts WHERE key IN "
                "({marks}) AND status NOT IN ('deleted', 'quarantined') "
                "ORDER BY created_at, id", keys):
            found[key] = Reusable(digest, status, reason)  # later rows win: the newest
        return found

    def past_runs(self, keys: set[str]) -> dict[str, PastRun]:
        return {key: PastRun(status, _seconds(started, finished))
                for key, status, started, finished in self._chunked(
                    "SELECT key, status, started_at, finished_at FROM stage_runs "
                    "WHERE key IN ({marks})", keys)}

    def built_keys(self, keys: set[str]) -> set[str]:
        # Only "?" placeholders are formatted into these statements, never a value.
        artifacts = ("SELECT DISTINCT key FROM artifacts WHERE key IN ({marks}) "
                     "AND status NOT IN ('deleted', 'quarantined')")
        # a smoke run makes no artifact: it is done when it passed and its artifact is ready
        smoked = ("SELECT s.key FROM stage_runs s JOIN artifacts a ON a.digest = "
                  "s.artifact_digest WHERE s.key IN ({marks}) AND s.status = 'succeeded' "
                  "AND a.status = 'ready'")
        found: set[str] = set()
        ordered = sorted(keys)
        for first in range(0, len(ordered), 500):  # bound the parameters of one statement
            chunk = ordered[first:first + 500]
            marks = ", ".join("?" * len(chunk))
            for sql in (artifacts, smoked):
                found.update(row[0] for row in self.rows(sql.format(marks=marks), *chunk))
        return found

    def last_toolchain(self, pool: str) -> Probed | None:
        if self._connection is None or not self._has_table("toolchains"):
            return None
        rows = self.rows("SELECT fingerprint, host, probed_at FROM toolchains WHERE pool = ? "
                          "ORDER BY probed_at DESC, id DESC LIMIT 1", pool)
        if not rows:
            return None
        fingerprint, host, probed_at = rows[0]
        return Probed(json_column(fingerprint), host, str(probed_at), pool)

    def recorded_pools(self) -> list[Probed]:
        if self._connection is None or not self._has_table("toolchains"):
            return []
        rounds = ("SELECT t.id, t.pool, t.gpu, t.fingerprint, t.host, t.probed_at, t.node_id "
                  "FROM toolchains t JOIN (SELECT pool, MAX(probed_at) AS at FROM toolchains "
                  "GROUP BY pool) m ON m.pool = t.pool AND m.at = t.probed_at")
        per_gpu = ("SELECT t.id, t.pool, t.gpu, t.fingerprint, t.host, t.probed_at, t.node_id "
                   "FROM toolchains t JOIN (SELECT MAX(id) AS id FROM toolchains WHERE pool "
                   "LIKE ? GROUP BY pool, gpu) m ON m.id = t.id")
        found: dict[int, tuple[Any, ...]] = {}
        for sql, values in ((rounds, ()), (per_gpu, ("host:%",))):
            found.update((row[0], row) for row in self.rows(sql, *values))
        ordered = sorted(found.values(), key=lambda row: (str(row[5]), row[0]), reverse=True)
        return [Probed(json_column(fingerprint), str(host), str(probed_at), str(pool), str(gpu),
                       node_id)
                for _, pool, gpu, fingerprint, host, probed_at, node_id in ordered]

    def _has_table(self, name: str) -> bool:
        if self._placeholder == "?":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?"
        else:
            sql = "SELECT to_regclass(?)::text"
        rows = self.rows(sql, name)
        return bool(rows and rows[0][0])

    def find_by_prefix(self, hex_prefix: str) -> list[str]:
        # hex_prefix is hex digits only (refs checked it), so LIKE needs no escaping
        rows = self.rows("SELECT digest FROM artifacts WHERE digest LIKE ?",
                          f"sha256:{hex_prefix}%")
        return sorted(row[0] for row in rows)

    def alias_names(self) -> list[str]:
        return sorted(str(row[0]) for row in self.rows("SELECT name FROM aliases"))

    def get_alias(self, name: str) -> str | None:
        rows = self.rows("SELECT digest FROM aliases WHERE name = ?", name)
        return rows[0][0] if rows else None

    def status(self, digest: str) -> tuple[str | None, str | None]:
        """(status, status_reason), or Nones when the digest is not registered."""
        rows = self.rows("SELECT status, status_reason FROM artifacts WHERE digest = ?",
                          digest)
        return (rows[0][0], rows[0][1]) if rows else (None, None)


@contextmanager
def open_reader(url: str, retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> Iterator[DriverReader]:
    """The registry at *url* read on its database driver alone, for every driver-only read
    (this module's, `listing`, `warm_lookup`, `alias_targets`); a driver error comes out as
    enginectl's (unreachable, damaged, or `RegistryError` in one line)."""
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    opener: Callable[[str], AbstractContextManager[Any]]
    driver_error: type[Exception]
    if scheme == "sqlite":
        import sqlite3

        opener, placeholder, driver_error = _sqlite, "?", sqlite3.Error
    elif scheme in ("postgresql", "postgres"):
        import psycopg

        opener, placeholder = partial(_postgres, retry_s=retry_s), "%s"
        driver_error = psycopg.Error
    else:
        raise RegistryError(
            f"unsupported registry URL {masked_url(url)}: "
            "use sqlite:///path/registry.db or postgresql+psycopg://user@host/db"
        )
    try:
        with opener(url) as (connection, absent):
            yield DriverReader(connection, placeholder, absent)
    except driver_error as exc:
        raise driver_failure(url, exc) from exc


def driver_failure(url: str, exc: Exception) -> RegistryError:
    """enginectl's error for the driver's *exc* on the registry at *url*: unreachable,
    damaged (a SQLite file), or `RegistryError` in one line."""
    lines = str(exc).strip().splitlines()
    bad = damaged(_sqlite_path(url), exc) if url.startswith("sqlite") else None
    return unreachable(masked_url(url), exc) or bad or RegistryError(
        f"cannot use registry {masked_url(url)}: {lines[0] if lines else type(exc).__name__}")


@contextmanager
def _sqlite(url: str) -> Iterator[tuple[Any, str | None]]:
    """A read-only connection, or None and why ("file", "tables") when there is no registry
    file (or no tables) yet. The path rules are SQLAlchemy's: `sqlite:///relative.db`,
    `sqlite:////absolute.db`."""
    import sqlite3

    file = _sqlite_path(url)
    if not file.is_file():
        yield None, "file"
        return
    refuse_empty(file, file.stat().st_size)
    uri = f"{file.absolute().as_uri()}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=30)) as connection:
        tables = {row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        yield (connection, None) if {"artifacts", "aliases"} <= tables else (None, "tables")


def _sqlite_path(url: str) -> Path:
    parts = urlsplit(url)
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not path or path == ":memory:" or parts.query:
        raise RegistryError(f"registry {masked_url(url)} is not a SQLite file URL")
    return Path(path).expanduser()


@contextmanager
def _postgres(url: str, *, retry_s: float) -> Iterator[tuple[Any, str | None]]:
    """Autocommit; its reads retry a blip as the ORM's do (`registry.sql.resilient`)."""
    import psycopg

    from registry.sql.resilient import ResilientConnection

    parts = urlsplit(url)
    conninfo = urlunsplit(parts._replace(scheme="postgresql"))
    with ResilientConnection(lambda: psycopg.connect(conninfo, autocommit=True,
                                                     connect_timeout=10),
                             window_s=retry_s) as connection:
        connection.autocommit = True  # what each new connection is made with
        found = connection.execute(
            "SELECT to_regclass('artifacts') IS NOT NULL AND to_regclass('aliases') IS NOT NULL"
        ).fetchone()
        yield (connection, None) if found and found[0] else (None, "tables")


