"""What `ls` and `info` read from the registry, on the database driver alone
(`registry.sql.lookup`'s reader): SQLAlchemy's ORM alone costs more to import than either
command's whole answer, so neither imports it.

`listed_artifacts` answers exactly what `registry.ops.inventory.ls` answered through the ORM
(`records.list_artifacts`, the `artifact_evidence` rows and `alias_records.aliases_for`;
tests/integration/test_listing.py holds the two to one answer): the artifacts matching the
filters, oldest first, each as a dict of its row with its aliases and the GPUs it passed a
smoke run on. It reads only a registry at the schema head (`lookup.HEAD`) and refuses any
other (`refuse_unless_head`) in the words and errors that opening it for reading through the
ORM uses (`registry.sql.db`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from registry.config import REGISTRY_RETRY_DEFAULT_S, masked_url
from registry.errors import NoRegistryError
from registry.sql.lookup import HEAD, DriverReader, json_column, open_reader

COLUMNS: Final = (
    "digest", "kind", "model", "size", "file_count", "status", "key", "runtime", "gpu", "sm",
    "quant", "kv_cache_dtype", "tp", "pp", "max_batch_size", "max_input_len", "max_seq_len",
    "max_num_tokens", "toolchain", "labels", "status_reason", "recipe_digest", "created_at",
    "updated_at",
)
"""`records.ArtifactRecord`'s fields but its files, in its order (what `ls --json` prints)."""

_JSON: Final = frozenset({"toolchain", "labels"})
_TIMES: Final = frozenset({"created_at", "updated_at"})
_FILTERS: Final = ("model", "gpu", "kind", "quant", "status", "digest")


def utc_time(value: Any) -> datetime:
    """A timestamp column's value as `UTCDateTime` returns it (aware, UTC): SQLite keeps
    naive UTC text, psycopg hands back an aware datetime."""
    found = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(found, datetime):
        raise TypeError(f"not a timestamp: {value!r}")
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


def utc_text(value: Any) -> str | None:
    """A timestamp column in ISO form (`utc_time`), None for NULL."""
    return None if value is None else utc_time(value).isoformat()


def schema_revision(url: str, *, retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> str | None:
    """The registry's schema revision, None when it has none yet (no file, no tables);
    reads only, as `registry.sql.schema.current` does."""
    with open_reader(url, retry_s) as reader:
        return reader.revision()


def refuse_unless_head(reader: DriverReader, url: str) -> None:
    """Refuse the registry *reader* reads unless it is at the schema head, as
    `registry.sql.db.open_registry(readonly=True)` does: `NoRegistryError` when there is
    none (no SQLite file: *missing*; no tables or no revision), `SchemaError` when it is
    behind or newer (Alembic, a slow import, is loaded only then, to tell which)."""
    if reader.absent is not None:
        raise NoRegistryError(masked_url(url), missing=reader.absent == "file")
    revision = reader.revision()
    if revision == HEAD:
        return
    if revision is None:
        raise NoRegistryError(masked_url(url), missing=False)
    from registry.sql.schema import schema_error, schema_state

    raise schema_error(revision, schema_state(revision), masked_url(url))


def listed_artifacts(url: str, *, retry_s: float = REGISTRY_RETRY_DEFAULT_S,
                     alias: str | None = None, **filters: str | None) -> list[dict[str, Any]]:
    """`inventory.ls`'s rows (module doc) for *filters* (model, gpu, kind, quant, status) and
    *alias*; a registry not at the schema head is refused (`refuse_unless_head`)."""
    with open_reader(url, retry_s) as reader:
        refuse_unless_head(reader, url)
        return listed_rows(reader, alias=alias, **filters)


def listed_rows(reader: DriverReader, *, alias: str | None = None,
                **filters: str | None) -> list[dict[str, Any]]:
    """`listed_artifacts` on an open *reader* (at the head); *filters* may also name one
    `digest` (what `show` reads, `registry.sql.showing`)."""
    where = [f"a.{name} = ?" for name in _FILTERS if filters.get(name) is not None]
    values = [str(filters[name]) for name in _FILTERS if filters.get(name) is not None]
    join = ""
    if alias is not None:
        join = " JOIN aliases n ON n.digest = a.digest"
        where.append("n.name = ?")
        values.append(alias)
    # only column names and "?" marks are formatted in, never a value
    sql = (f"SELECT {', '.join('a.' + name for name in COLUMNS)} FROM artifacts a"  # noqa: S608
           f"{join}{' WHERE ' + ' AND '.join(where) if where else ''} "
           "ORDER BY a.created_at, a.id")
    rows = reader.rows(sql, *values)
    if not rows:
        return []
    digests = sorted({str(row[0]) for row in rows})
    names: dict[str, list[str]] = {}
    proofs: dict[str, list[dict[str, Any]]] = {}
    for first in range(0, len(digests), 500):  # bound the parameters of one statement
        chunk = digests[first:first + 500]
        marks = ", ".join("?" * len(chunk))
        for name, digest in reader.rows(
                f"SELECT name, digest FROM aliases WHERE digest IN ({marks})",  # noqa: S608
                *chunk):
            names.setdefault(str(digest), []).append(str(name))
        for digest, gpu, best, passed_at in reader.rows(
                "SELECT a.digest, e.gpu, e.best_tokens_per_s, e.passed_at FROM "  # noqa: S608
                "artifact_evidence e JOIN artifacts a ON a.id = e.artifact_id WHERE "
                f"a.digest IN ({marks}) ORDER BY a.digest, e.gpu", *chunk):
            proofs.setdefault(str(digest), []).append(
                {"gpu": gpu, "best_tokens_per_s": best, "passed_at": utc_text(passed_at)})
    found = []
    for row in rows:
        data = dict(zip(COLUMNS, row, strict=True))
        for name in _JSON:
            data[name] = None if data[name] is None else json_column(data[name])
        for name in _TIMES:
            data[name] = utc_text(data[name])
        digest = str(data["digest"])
        found.append(data | {"aliases": sorted(names.get(digest, []))}
                     | {"evidence": proofs.get(digest, [])})
    return found
