"""The heartbeat: the one thread that keeps a row with an expiry alive — a held lease
(`registry.sql.leases`, the default) or a publish's pending row (`registry.ops.pending`).

    with Heartbeat(ctx.registry, key, owner=owner, ttl_s=ttl_s, on_lost=stop_the_work):
        ...  # the work the lease guards

    Heartbeat(ctx.registry, pending_id, owner=owner, ttl_s=ttl_s, on_lost=note_it,
              renew=renew_the_row, what=f"pending publish {pending_id}",
              why_lost=lambda: "its row was removed")

*renew* (one session in, True: renewed, False: the row is not ours any more) is what one
renewal does; *what* names the row in the reasons, *why_lost* says why a False answer lost
it. Their defaults are the lease on *key* held by *owner*.

It renews the row every third of its TTL. A renewal that fails (the database restarted, a
connection was dropped, the network blinked) is retried with backoff for as long as the
lease still has time left; a blip never loses a lease. While it runs, every registry call of
this process retries its own connection faults until the time the row must be renewed by
(`registry.sql.transient.LEASES`), never longer. The lease is lost when

    - a renewal answers "not yours" (another builder took it over, or its run was finished
      under it), or
    - no renewal reached the database until only a sixth of the TTL was left (counted from
      the last renewal that did, on this host's monotonic clock): a builder that cannot
      reach the registry stops before another may take the key over.

Then `on_lost(reason)` is called once, from the heartbeat's thread, with one line saying
why ("lease on k1:... lost: taken over by host:123:ab12 on host (pid 123)"): the caller
stops the work the lease guards (a stage's process group, a nightly) and records it. `lost`
keeps the reason. This module never imports `pipeline`: what "stop" means is the caller's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Final

from registry.sql import leases
from registry.sql.db import Registry
from registry.sql.transient import LEASES

if TYPE_CHECKING:
    from registry.sql.rows import Executor

NO_ANSWER: Final = "the registry did not answer in time"
STOP_WAIT_S: Final = 10.0
"""How long `stop` waits for a renewal in flight (one that outlived its own time limit)."""
FIRST_RETRY_S: Final = 0.1
"""The first backoff after a failed renewal; it doubles up to a tenth of the TTL."""


class Heartbeat:
    """Renews *owner*'s lease on *key* (or what *renew* renews) in a daemon thread from
    `start` to `stop` (or a `with` block); see the module doc. *taken_at* is when the
    statement that took the lease (or wrote the row) was sent (`time.monotonic()`; None: now,
    for a heartbeat started right after it)."""

    def __init__(self, registry: Registry, key: str, *, owner: str, ttl_s: float,
                 on_lost: Callable[[str], None], taken_at: float | None = None,
                 renew: Callable[[Executor], bool] | None = None, what: str | None = None,
                 why_lost: Callable[[], str] | None = None) -> None:
        self.registry, self.key, self.owner, self.ttl_s = registry, key, owner, ttl_s
        self.on_lost, self.taken_at = on_lost, taken_at
        self.renew = renew or self._renew_lease
        self.what = what or f"lease on {key}"
        self.why_lost = why_lost or self._taken_over
        self.lost: str | None = None
        """Why the lease was lost (None while it is held)."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{key[:15]}",
                                        daemon=True)
        self._held_until = 0.0
        self._renewing: threading.Thread | None = None
        self._error = ""

    def start(self) -> Heartbeat:
        self._held_until = (self.taken_at or time.monotonic()) + self.ttl_s
        self._hold()
        self._thread.start()
        return self

    def _hold(self) -> None:
        """Every registry call of this process retries a blip no longer than this row must
        be renewed by (`registry.sql.transient.LEASES`)."""
        LEASES.hold(id(self), self._held_until - self.ttl_s / 6, self.what)

    def stop(self) -> None:
        """Stop renewing (the work ended; the caller releases the lease). A renewal still in
        flight is given STOP_WAIT_S to give its connection back, so that the caller may
        close the registry after this."""
        self._done.set()
        LEASES.drop(id(self))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self.lost is None and self._thread.ident is not None \
                and time.monotonic() >= self._held_until - self.ttl_s / 6:
            # stopped past the time it had to be renewed by: lost, though no renewal said so
            # yet (the caller's own registry call gave up at that time, `transient.LEASES`)
            unreached = time.monotonic() - (self._held_until - self.ttl_s)
            self.lost = (f"{self.what} lost: no renewal reached the registry for "
                         f"{unreached:.0f} s (last error: {self._error or NO_ANSWER})")
        renewing = self._renewing
        if renewing is not None and renewing is not threading.current_thread():
            renewing.join(STOP_WAIT_S)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _beat(self) -> None:
        interval, margin = self.ttl_s / 3, self.ttl_s / 6
        backoff = FIRST_RETRY_S
        due = self._held_until - self.ttl_s + interval
        error = self._error = ""
        while not self._done.wait(max(0.0, due - time.monotonic())):
            sent = time.monotonic()
            answer = self._attempt(self._held_until - margin - sent)
            if self._done.is_set():
                return
            if answer is True:
                self._error = ""
                self._held_until = sent + self.ttl_s
                self._hold()
                backoff, due = FIRST_RETRY_S, sent + interval
                continue
            if answer is False:
                self._lose(f"{self.what} lost: {self.why_lost()}")
                return
            if answer != NO_ANSWER or not error:  # what failed, rather than the time out
                error = self._error = answer
            left = self._held_until - margin - time.monotonic()
            if left <= 0:
                unreached = time.monotonic() - (self._held_until - self.ttl_s)
                self._lose(f"{self.what} lost: no renewal reached the registry for "
                           f"{unreached:.0f} s (last error: {error})")
                return
            due = time.monotonic() + min(backoff, left)
            backoff = min(backoff * 2, max(FIRST_RETRY_S, self.ttl_s / 10))

    def _attempt(self, timeout_s: float) -> bool | str:
        """One renewal, given at most *timeout_s* (a hung connection must not outlast the
        lease): True renewed, False not ours any more, else the error, in one line."""
        answer: list[bool | str] = []

        def renew() -> None:
            try:
                with self.registry.connection() as session:
                    answer.append(self.renew(session))
            except Exception as exc:  # noqa: BLE001 - any failure is retried while time is left
                answer.append(" ".join(f"{type(exc).__name__}: {exc}".split())[:300])

        attempt = threading.Thread(target=renew, name="heartbeat-renew", daemon=True)
        self._renewing = attempt
        attempt.start()
        attempt.join(max(0.0, timeout_s))
        return answer[0] if answer else NO_ANSWER

    def _renew_lease(self, session: Executor) -> bool:
        return leases.renew_lease(session, self.key, owner=self.owner, ttl_s=self.ttl_s)

    def _taken_over(self) -> str:
        """Why a lease renewal answered "not yours", from the lease's row."""
        try:
            with self.registry.connection(readonly=True) as session:
                held = leases.get_stage_run(session, self.key)
        except Exception:  # noqa: BLE001 - the reason is best effort; the loss is certain
            return f"it is no longer held by {self.owner}"
        if held is None:
            return "its row was removed"
        if held.status != "running":
            return f"its run was marked {held.status}"
        return f"taken over by {held.owner} on {held.host} (pid {held.pid})"

    def _lose(self, reason: str) -> None:
        # kept in LEASES, its time past, until `stop`: a blip met meanwhile by a call of the
        # work it guarded fails that call at once, rather than letting it wait and finish
        self.lost = reason
        self.on_lost(reason)
