"""A registry reader held open across calls: `registry.sql.lookup`'s reader on the database
driver alone, one connection for many reads (`Context.reader`: every resolve a process makes
reads on it), where `open_reader` is one connection for one `with` block.

Opened once, at the schema head or refused (`registry.sql.listing.refuse_unless_head`, in
the words opening the registry for reading uses); each use is a `with held.reading()` block,
whose driver errors come out as `open_reader`'s do (`lookup.driver_failure`: unreachable,
damaged, or `RegistryError` in one line). On PostgreSQL the connection is autocommit and
retries a blip (`registry.sql.resilient`): each statement is one round trip, no BEGIN or
COMMIT around it, and psycopg prepares a statement the connection runs again and again.
The connection serves the thread that opened it; a call from another thread reads on a
connection of its own for that call (`open_reader`), as a DB-API connection is one thread's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from registry.config import REGISTRY_RETRY_DEFAULT_S
from registry.sql.listing import refuse_unless_head
from registry.sql.lookup import DriverReader, driver_failure, open_reader


class HeldReader:
    """The registry at *url* read on its driver, open until `close` (module doc)."""

    def __init__(self, url: str, retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> None:
        self._url, self._retry_s = url, retry_s
        self._thread = threading.get_ident()
        with ExitStack() as opening:
            self._reader = opening.enter_context(open_reader(url, retry_s))
            refuse_unless_head(self._reader, url)
            self._open = opening.pop_all()
        failure: type[Exception]
        if self._reader.dialect == "sqlite":
            import sqlite3

            failure = sqlite3.Error
        else:
            import psycopg

            failure = psycopg.Error
        self._failure = failure

    @contextmanager
    def reading(self) -> Iterator[DriverReader]:
        if threading.get_ident() != self._thread:  # another thread's: a connection of its own
            with open_reader(self._url, self._retry_s) as reader:
                refuse_unless_head(reader, self._url)
                yield reader
            return
        try:
            yield self._reader
        except self._failure as exc:
            raise driver_failure(self._url, exc) from exc

    def close(self) -> None:
        self._open.close()
