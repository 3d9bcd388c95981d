"""Transient database faults: which errors a registry call retries, and for how long.

A connection that was reset, refused or closed by the server ("server closed the connection
unexpectedly", SQLSTATE class 08, a server shutting down or starting up) is a blip: the call
that met it is retried with backoff (`retrying`) until its budget runs out. Anything else (a
constraint, a syntax error, a password refused, a role not allowed to log in) is not retried.
`is_transient` is the one place that decides.

The budget (`budget`) is the time the leases this process holds have left: every lease
(`registry.sql.heartbeat` registers each one it renews in `LEASES`) must be renewed before
its holder stops at a sixth of its TTL left, and a registry call never waits past that
point, so a builder that cannot reach the registry stops before another may take its key
over. A process that holds no lease (a `pull`, a `fetch`, a plan) waits for the registry's
retry window (`ENGINECTL_REGISTRY_RETRY_S`, `registry.config.REGISTRY_RETRY_DEFAULT_S`),
counted from the first failure of the call.

What a retry repeats, and why that is safe, is `registry.sql.resilient`'s business; this
module never imports SQLAlchemy or a driver (the fetch path keeps them off).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    from registry.errors import RegistryUnreachableError

from registry.config import REGISTRY_RETRY_DEFAULT_S

T = TypeVar("T")

FIRST_BACKOFF_S: Final = 0.05
MAX_BACKOFF_S: Final = 1.0
NOTE_AFTER_S: Final = 1.0
"""A call still waiting this long says so, once a process (`LOG`): a registry URL with a typo
would otherwise hang for the whole window without a word."""
LOG: Final = logging.getLogger("enginectl.registry")
_said = threading.Event()

_MESSAGES: Final = (
    "server closed the connection unexpectedly", "connection refused", "connection reset",
    "connection failed", "consuming input failed", "sending query failed",
    "terminating connection due to administrator command", "the connection is lost",
    "the connection is closed", "could not receive data from server",
    "could not send data to server", "connection timed out", "broken pipe",
    "ssl syscall error", "eof detected",
)
_SHUTDOWN_STATES: Final = frozenset({"57P01", "57P02", "57P03"})
"""admin_shutdown (pg_terminate_backend, a restart), crash_shutdown, cannot_connect_now."""


def is_transient(exc: BaseException) -> bool:  # noqa: PLR0911 - one rule per kind of error
    """Whether *exc* is a connection fault worth retrying: a psycopg `OperationalError` with
    no SQLSTATE (the client lost the connection) or one of class 08 or 57P01-03, an OS-level
    reset or refusal, or SQLAlchemy's error for one (`connection_invalidated`)."""
    if getattr(exc, "connection_invalidated", False):
        return True
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException) and orig is not exc:
        return is_transient(orig)
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    names = {kind.__name__ for kind in type(exc).__mro__}
    if "OperationalError" not in names and "InterfaceError" not in names:
        return False
    if "sqlite3" in type(exc).__module__:
        return False  # a file, not a connection: "database is locked" has its busy timeout
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str):
        return state.startswith("08") or state in _SHUTDOWN_STATES
    text = str(exc).lower()
    if "fatal:" in text:  # the server answered a connect and refused it (a role, a database)
        return "the database system is" in text  # ... starting up, shutting down
    return "OperationalError" in names or any(marker in text for marker in _MESSAGES)


def first_line(exc: BaseException) -> str:
    """*exc*'s message on one line (the driver's, under SQLAlchemy's wrapper)."""
    orig = getattr(exc, "orig", None)
    source = orig if isinstance(orig, BaseException) else exc
    text = " ".join(str(source).split())
    return text[:300] or type(source).__name__


class Leases:
    """The leases this process holds, each with the monotonic time by which its holder
    must have renewed it (a sixth of its TTL before it expires). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[float, str]] = {}

    def hold(self, token: int, until: float, what: str) -> None:
        """*what* ("lease on k1:...") is held until *until*; called again on each renewal."""
        with self._lock:
            self._held[token] = (until, what)

    def drop(self, token: int) -> None:
        with self._lock:
            self._held.pop(token, None)

    def earliest(self) -> tuple[float, str] | None:
        """(until, what) of the lease that must be renewed first; None when none is held."""
        with self._lock:
            return min(self._held.values(), default=None)


LEASES: Final = Leases()


@dataclass(frozen=True, slots=True)
class Budget:
    """Until when (monotonic) a failing call may retry, and the lease that bounds it."""

    deadline: float
    lease: str | None
    """"lease on k1:..." when a held lease bounds the retries, else None (the window)."""


def budget(first_failure: float, window_s: float) -> Budget:
    """The budget of a call that first failed at *first_failure* (monotonic)."""
    held = LEASES.earliest()
    if held is not None:
        return Budget(held[0], held[1])
    return Budget(first_failure + window_s, None)


def spent(exc: BaseException) -> tuple[Budget, float] | None:
    """(budget, seconds waited) when *exc* (or the driver error under it) is the last error
    of a call that retried until its budget ran out."""
    for candidate in (exc, getattr(exc, "orig", None)):
        found = getattr(candidate, "__enginectl_budget__", None)
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None


def retrying(attempt: Callable[[], T], *, window_s: float = REGISTRY_RETRY_DEFAULT_S,
             sleep: Callable[[float], object] = time.sleep) -> T:
    """*attempt()*, again after each transient error, with backoff from
    FIRST_BACKOFF_S doubling to MAX_BACKOFF_S, while the budget lasts (the last try at its
    deadline, so that a lease's holder has passed it when the call fails). The last error is
    raised unchanged, marked (`spent`) with the budget and how long the call waited; any
    other error is raised at once."""
    started: float | None = None
    backoff = FIRST_BACKOFF_S
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not is_transient(exc):
                raise
            now = time.monotonic()
            if started is None:
                started = now
            limit = budget(started, window_s)
            if now >= limit.deadline:
                with contextlib.suppress(AttributeError):  # a driver error without a dict
                    setattr(exc, "__enginectl_budget__", (limit, now - started))  # noqa: B010
                raise
            if now - started >= NOTE_AFTER_S and not _said.is_set():
                _said.set()
                LOG.warning("the registry does not answer (%s); retrying for up to %.0f s more "
                            "(ENGINECTL_REGISTRY_RETRY_S, or the lease held)",
                            " ".join(str(exc).split())[:160], limit.deadline - now)
            sleep(max(0.0, min(backoff, limit.deadline - now)))  # the last try at the deadline
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def unreachable(url: str, exc: BaseException) -> RegistryUnreachableError | None:
    """The error to raise for *exc* from the registry at *url* (password hidden) when it is
    the last fault of a call that retried until its budget ran out: `LeaseLostError` when a
    held lease bounded it, else `RegistryUnreachableError`; None for any other error."""
    from registry.errors import LeaseLostError, RegistryUnreachableError

    found = spent(exc)
    if found is None:
        return None
    limit, waited_s = found
    if limit.lease is not None:
        return LeaseLostError(limit.lease, url, first_line(exc), waited_s=waited_s)
    return RegistryUnreachableError(url, first_line(exc), waited_s=waited_s)
