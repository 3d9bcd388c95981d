"""A PostgreSQL connection that outlives a blip: what SQLAlchemy's pool and the driver-only
reads (`registry.sql.lookup`) hold instead of a bare psycopg connection.

    connection = ResilientConnection(lambda: psycopg.connect(conninfo), window_s=30.0)

Every call that meets a connection fault (`registry.sql.transient.is_transient`) is retried
on a new connection, with backoff, while the budget lasts (`transient.retrying`: the held
leases' time, else the window). What a retry repeats is safe to repeat:

- A statement outside a transaction (autocommit) is repeated only when it reads (SELECT,
  WITH, SHOW).
- In a transaction, nothing was committed when the connection broke (the server rolls the
  transaction back), so the statements it ran so far that write or lock are run again, in
  order, on the new connection, and each must answer exactly as it did the first time (the
  same rows, the same row count; a serial id an INSERT draws anew is mapped to the first,
  `registry.sql.replay`): the caller's decisions were made on those answers, so the
  transaction is one it could have run. Plain reads are not run again: under READ
  COMMITTED (the registry's level) each saw the database as of its own statement, which a
  read earlier in a transaction may always be. An answer that differs (another writer came
  between) ends the retry with the original error: nothing of it landed.
- A COMMIT whose answer was lost may or may not have landed. Before it is sent, a write
  transaction's id is read (`pg_current_xact_id_if_assigned`); after a fault the new
  connection asks the server what became of that id (`pg_xact_status`): committed is done,
  aborted runs the transaction again as above, in progress asks again.
- A connection that holds a session-level advisory lock (the gc lock) is never replaced
  under its holder: the lock went with the broken connection, and only its holder knows
  what that means (`registry.sql.gclock`).

The connection settings SQLAlchemy makes (autocommit, isolation level, read only,
deferrable) are set again on every new connection; the URL's options (search_path) come
with the connect call.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from registry.config import REGISTRY_RETRY_DEFAULT_S
from registry.sql.replay import Answer as _Answer
from registry.sql.replay import Ids as _Ids
from registry.sql.replay import Step as _Step
from registry.sql.replay import ask as _ask
from registry.sql.transient import is_transient, retrying

_SETTINGS: Final = ("autocommit", "isolation_level", "read_only", "deferrable")
_READ: Final = re.compile(r"\s*(\(?\s*SELECT\b|WITH\b|SHOW\b|;|$)", re.IGNORECASE)
_LOCKS: Final = re.compile(r"\bpg_(try_)?advisory_lock(_shared)?\s*\(", re.IGNORECASE)
_UNLOCKS: Final = re.compile(r"\bpg_advisory_unlock(_shared|_all)?\s*\(", re.IGNORECASE)
_XID: Final = "SELECT pg_current_xact_id_if_assigned()::text"
_WRITES: Final = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE|FOR\s+UPDATE|FOR\s+SHARE|"
                            r"advisory_xact_lock|nextval|CREATE|ALTER|DROP|TRUNCATE)\b",
                            re.IGNORECASE)


class ReplayMismatchError(Exception):
    """A statement answered differently when its transaction ran again on a new connection."""


class ResilientConnection:
    """A DB-API connection over psycopg connections made by *connect* (see the module doc).
    One thread at a time, as any DB-API connection."""

    def __init__(self, connect: Callable[[], Any], *,
                 window_s: float = REGISTRY_RETRY_DEFAULT_S) -> None:
        object.__setattr__(self, "_connect", connect)
        object.__setattr__(self, "_window_s", window_s)
        object.__setattr__(self, "_settings", {})
        object.__setattr__(self, "_steps", [])
        object.__setattr__(self, "_pinned", 0)
        object.__setattr__(self, "_xid", None)
        object.__setattr__(self, "_ids", _Ids())
        object.__setattr__(self, "_conn", self._retry(connect))

    # --- what SQLAlchemy and the readers call -------------------------------------------------

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a named (server-side) cursor: no retry
            return self._conn.cursor(*args, **kwargs)
        return ResilientCursor(self)

    def execute(self, sql: Any, params: Any = None, **kwargs: Any) -> ResilientCursor:
        cursor = ResilientCursor(self)
        cursor.execute(sql, params, **kwargs)
        return cursor

    def commit(self) -> None:
        if not self._steps:
            self._quietly_end("commit")
            return
        if any(_WRITES.search(str(step.sql)) for step in self._steps):
            answer = self._run("execute", _XID, None, {}, log=False)
            object.__setattr__(self, "_xid", answer.rows[0][0] if answer.rows else None)
        try:
            self._conn.commit()
        except Exception as exc:
            if not is_transient(exc) or self._pinned:
                raise
            self._retry(self._settle, first=exc, replay=False)
        finally:
            self._steps.clear()
            object.__setattr__(self, "_xid", None)
            object.__setattr__(self, "_ids", _Ids())

    def rollback(self) -> None:
        self._steps.clear()
        object.__setattr__(self, "_ids", _Ids())
        self._quietly_end("rollback")

    def close(self) -> None:
        self._steps.clear()
        try:
            self._conn.close()
        except Exception as exc:
            if not is_transient(exc):
                raise

    def __enter__(self) -> ResilientConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _SETTINGS:
            setattr(self._conn, name, value)
            return
        self._settings[name] = value
        try:
            setattr(self._conn, name, value)
        except Exception as exc:
            if not is_transient(exc) or self._pinned:
                raise  # else the next statement sets it on a new connection

    # --- the retries --------------------------------------------------------------------------

    def _retry(self, attempt: Callable[[], Any], first: BaseException | None = None, *,
               replay: bool = True) -> Any:
        """*attempt()* under `transient.retrying`; when the fault *first* was met already,
        each try reconnects (running the open transaction again) before it attempts. A
        transaction that answers differently ends it with *first* (its connection closed,
        so that SQLAlchemy's pool drops it)."""
        if first is None:
            return retrying(attempt, window_s=self._window_s)

        def again() -> Any:
            self._reconnect(replay=replay)
            return attempt()

        try:
            return retrying(_raising_once(first, again), window_s=self._window_s)
        except ReplayMismatchError:
            self._steps.clear()
            with contextlib.suppress(Exception):
                self._conn.close()
            raise first from None

    def _run(self, method: str, sql: Any, params: Any, kwargs: dict[str, Any], *,
             log: bool = True) -> _Answer:
        """*method* of a cursor with *sql*, retried as the module doc says."""
        def once() -> _Answer:
            ids: _Ids = self._ids
            cursor = self._conn.cursor()
            try:
                return ids.back(_ask(cursor, method, sql, ids.forth(params), kwargs))
            finally:
                cursor.close()

        autocommit = bool(self._settings.get("autocommit", False))
        repeatable = not self._pinned and (not autocommit or _READ.match(str(sql)) is not None)
        if self._conn.broken and repeatable and not self._steps:
            self._retry(self._reconnect)
        try:
            answer = once()
        except Exception as exc:
            if not is_transient(exc) or not repeatable:
                raise
            answer = self._retry(once, first=exc)
        text = str(sql)
        if _LOCKS.search(text):
            object.__setattr__(self, "_pinned", self._pinned + 1)
        elif _UNLOCKS.search(text):
            object.__setattr__(self, "_pinned", max(0, self._pinned - 1))
        if log and not autocommit:
            self._steps.append(_Step(method, sql, params, kwargs, answer))
        return answer

    def _reconnect(self, *, replay: bool = True) -> None:
        """A new connection with the same settings, on which (with *replay*) the open
        transaction's statements so far answered as before (ReplayMismatchError, raised as
        the original fault by the caller, when one did not)."""
        with contextlib.suppress(Exception):  # it is broken: closing is a courtesy
            self._conn.close()
        fresh = self._connect()
        object.__setattr__(self, "_conn", fresh)
        for name in _SETTINGS:
            if name in self._settings:
                setattr(fresh, name, self._settings[name])
        ids = _Ids()
        object.__setattr__(self, "_ids", ids)
        strict = getattr(self._settings.get("isolation_level"), "name", "READ_COMMITTED") \
            not in ("READ_COMMITTED", "READ_UNCOMMITTED")
        for step in self._steps if replay else ():
            if not strict and _plain_read(step.sql):
                continue  # seen as of its own time, which READ COMMITTED allows any read
            cursor = fresh.cursor()
            try:
                again = _ask(cursor, step.method, step.sql, ids.forth(step.params), step.kwargs)
            finally:
                cursor.close()
            if not ids.learn(step, again):
                raise ReplayMismatchError(str(step.sql)[:200])

    def _settle(self) -> None:
        """After a COMMIT whose answer was lost, on a new connection: done when the write
        transaction committed (or wrote nothing), else it runs again (its new id noted) and
        is committed; a fault on the way is retried from here."""
        xid: str | None = self._xid
        if xid is not None:
            row = self._conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
            self._conn.rollback()
            status = row[0] if row else None
            if status == "committed":
                return
            if status == "in progress":  # the old backend has not noticed yet: ask again
                raise _StillRunningError(f"transaction {xid} still in progress")
            self._reconnect()  # aborted: run it again
            again = self._conn.execute(_XID).fetchone()
            object.__setattr__(self, "_xid", again[0] if again else None)
        self._conn.commit()

    def _quietly_end(self, verb: str) -> None:
        """COMMIT or ROLLBACK of a transaction that wrote nothing: a fault loses nothing (the
        server ends it), and the next statement gets a new connection."""
        try:
            getattr(self._conn, verb)()
        except Exception as exc:
            if not is_transient(exc) or self._pinned:
                raise


class _StillRunningError(ConnectionError):
    """A lost COMMIT whose transaction the server still runs: asked again (transient)."""


def _raising_once(exc: BaseException, then: Callable[[], Any]) -> Callable[[], Any]:
    raised = [False]

    def attempt() -> Any:
        if not raised[0]:
            raised[0] = True
            raise exc
        return then()
    return attempt


def _plain_read(sql: Any) -> bool:
    """A statement that neither writes nor locks (a SELECT, not FOR UPDATE/SHARE)."""
    text = str(sql)
    return _READ.match(text) is not None and _WRITES.search(text) is None


class ResilientCursor:
    """A DB-API cursor whose statements run through its `ResilientConnection`; the rows are
    read whole when the statement runs (to compare them when a transaction runs again)."""

    arraysize = 1

    def __init__(self, connection: ResilientConnection) -> None:
        self._connection = connection
        self._answer: _Answer | None = None
        self._at = 0

    def execute(self, sql: Any, params: Any = None, **kwargs: Any) -> ResilientCursor:
        self._answer = self._connection._run("execute", sql, params, kwargs)
        self._at = 0
        return self

    def executemany(self, sql: Any, params: Sequence[Any], **kwargs: Any) -> None:
        self._answer = self._connection._run(
            "executemany", sql, list(params), kwargs)
        self._at = 0

    @property
    def description(self) -> Any:
        return None if self._answer is None else self._answer.description

    @property
    def rowcount(self) -> int:
        return -1 if self._answer is None else self._answer.rowcount

    @property
    def statusmessage(self) -> str | None:
        return None if self._answer is None else self._answer.statusmessage

    def _rows(self) -> list[Any]:
        if self._answer is None or self._answer.rows is None:
            raise _no_results()
        return self._answer.rows

    def fetchone(self) -> Any:
        rows = self._rows()
        if self._at >= len(rows):
            return None
        self._at += 1
        return rows[self._at - 1]

    def fetchmany(self, size: int | None = None) -> list[Any]:
        rows = self._rows()
        count = self.arraysize if size is None else size
        found = rows[self._at:self._at + count]
        self._at += len(found)
        return found

    def fetchall(self) -> list[Any]:
        rows = self._rows()
        found = rows[self._at:]
        self._at = len(rows)
        return found

    def nextset(self) -> None:
        return None

    def close(self) -> None:
        self._answer = None

    def __iter__(self) -> ResilientCursor:
        return self

    def __next__(self) -> Any:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> ResilientCursor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _no_results() -> Exception:
    import psycopg

    return psycopg.ProgrammingError("the last operation didn't produce a result")
