"""The nightly lease, held while a nightly runs: one nightly at a time (`registry.sql.leases`),
a second waits for the first."""

from __future__ import annotations

import _thread
import os
import socket
import threading
from typing import TYPE_CHECKING

from pipeline.executors.local import owner_id
from pipeline.host.runner import CANCEL_GRACE_S, stop_all
from pipeline.settings import Settings
from registry.context import Context
from registry.errors import RegistryError, UsageError
from registry.progress import Echo
from registry.sql import leases
from registry.sql.heartbeat import Heartbeat

if TYPE_CHECKING:
    from pipeline.nightly.verdict import NightlyReport


class LeaseKeeper:
    """Holds the nightly lease: waits for another nightly that holds it, keeps it with a
    heartbeat (`registry.sql.heartbeat`) while this one runs, releases it at the end. When the
    lease is lost (taken over, or the registry out of reach until little of it was left)
    the nightly is stopped: its children at once, and its main thread as Ctrl-C would;
    `nightly` then fails with `lost_error()`."""

    def __init__(self, ctx: Context, settings: Settings, note: Echo) -> None:
        self.ctx, self.note = ctx, note
        self.owner = owner_id()
        self.ttl_s = settings.lease_ttl_s
        self.done = threading.Event()
        self.waited_for: str | None = None
        self.heartbeat: Heartbeat | None = None
        self.in_main = threading.current_thread() is threading.main_thread()

    @property
    def lost(self) -> str | None:
        return None if self.heartbeat is None else self.heartbeat.lost

    def lost_error(self) -> RegistryError:
        return RegistryError(f"{self.lost}; this nightly was stopped")

    def acquire(self, report: NightlyReport) -> LeaseKeeper:
        """Take the nightly lease, waiting for another nightly that holds it (noted in
        *report*), and start its heartbeat."""
        poll = min(5.0, self.ttl_s / 4)
        while True:
            with self.ctx.registry.session() as session:
                got = leases.try_acquire_nightly(session, owner=self.owner,
                                                 host=socket.gethostname(), pid=os.getpid(),
                                                 ttl_s=self.ttl_s)
                holder = None if got else leases.nightly_holder(session)
            if got:
                break
            if holder is not None and self.waited_for != holder.owner:
                self.waited_for = holder.owner
                self.note(f"another nightly holds the run: {holder.owner} on {holder.host}, "
                          f"since {holder.started_at:%Y-%m-%d %H:%M:%S} UTC; waiting for it")
            if self.done.wait(poll):
                raise UsageError("stopped while waiting for another nightly")
        self.heartbeat = Heartbeat(self.ctx.registry, leases.NIGHTLY_KEY, owner=self.owner,
                                   ttl_s=self.ttl_s, on_lost=self._stop).start()
        report.waited_for = self.waited_for
        return self

    def _stop(self, reason: str) -> None:
        self.note(f"nightly: {reason}; stopping")
        stop_all(CANCEL_GRACE_S)
        if self.in_main:
            _thread.interrupt_main()  # the build winds down as on Ctrl-C

    def release(self, failed: bool) -> None:
        self.done.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
            if self.lost is not None:
                return  # not ours any more
            with self.ctx.registry.session() as session:
                leases.release_lease(session, leases.NIGHTLY_KEY, owner=self.owner,
                                     status="failed" if failed else "succeeded")
