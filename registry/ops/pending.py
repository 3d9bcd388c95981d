"""Blobs in flight: what a publish relies on stays in the store until the row that references
it is committed, whatever gc does meanwhile.

    pending = Pending.begin(ctx, {digest: path, ...})   # a pending_publishes row, renewed
    pending.upload(progress=..., stop=...)              # the blobs the store lacks
    with pending.committing() as session:               # gc lock (shared); all blobs there
        ...rows that reference the blobs...             # the row goes in this transaction
    pending.end()                                       # stops renewing; drops a left row

Two mechanisms, because each alone has a hole:

- The pending row (blobs, owner, expiry) is committed before the publish asks which blobs
  the store already has, so a gc that starts later keeps them (gc keeps every blob of a live
  row; `registry.sql.pending_publishes`). Its expiry (`TTL`, an hour) is renewed by a
  `registry.sql.heartbeat.Heartbeat` every third of it while the publish runs; a renewal
  that fails (a database blip) is retried while the row has time left. A publisher killed
  mid-way leaves a row that expires, and then its blobs are fair game. A row that is lost
  while the publish runs (gc or someone removed it, or no renewal got through in time) is
  recorded in `lost`: gc may have taken its blobs, and the publish checks them all again
  before it registers (`registry.ops.publish`).
- A gc that had already listed the pending rows when the publish began, and found an old
  blob unreferenced, may still delete it after the publish saw it present. So the last
  step runs under the registry's gc lock, shared (`registry.sql.gclock`; gc holds it
  exclusively for its whole mark-and-sweep): every blob is checked again (size included)
  and any that is gone is uploaded again from its source, then the rows are committed.
  Nothing a committed row references can be missing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from registry.identity.digest import Digest
from registry.progress import NoProgress, Progress
from registry.sql.heartbeat import Heartbeat
from registry.sql.pending_publishes import TTL, add_pending, drop_pending, renew_pending
from registry.workers import WORKERS, Workers

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from registry.context import Context
    from registry.sql.rows import Executor


class Pending:
    """One publish's blobs in flight (see the module doc). *sources* maps each blob to a
    local file holding its bytes."""

    def __init__(self, ctx: Context, sources: Mapping[Digest, Path], pending_id: str) -> None:
        self.ctx = ctx
        self.sources = dict(sources)
        self.sizes = {digest: path.stat().st_size for digest, path in self.sources.items()}
        self.id = pending_id
        self.uploaded: list[Digest] = []
        self.committed = False
        self._heartbeat: Heartbeat | None = None

    @classmethod
    def begin(cls, ctx: Context, sources: Mapping[Digest, Path], *,
              renew: bool = True, ttl: timedelta = TTL) -> Pending:
        """Record the pending row (committed), expiring *ttl* from now, and keep renewing
        it until `end` (unless *renew* is False: a publish much shorter than the TTL)."""
        pending = cls(ctx, sources, uuid.uuid4().hex)
        owner = f"{socket.gethostname()}-{os.getpid()}"
        sent = time.monotonic()
        with ctx.registry.connection() as session:
            add_pending(session, pending.id, owner=owner, ttl=ttl,
                        blobs=sorted(str(d) for d in pending.sources))
        if renew:
            def renew_row(session: Executor) -> bool:
                return renew_pending(session, pending.id, ttl=ttl)

            pending._heartbeat = Heartbeat(
                ctx.registry, pending.id, owner=owner, ttl_s=ttl.total_seconds(),
                on_lost=lambda _reason: None, taken_at=sent, renew=renew_row,
                what=f"pending publish {pending.id}", why_lost=lambda: "its row was removed",
            ).start()
        return pending

    @property
    def lost(self) -> str | None:
        """Why the pending row was lost while the publish ran, in one line (None: it was
        renewed all along): its blobs may have been collected meanwhile."""
        return self._heartbeat.lost if self._heartbeat is not None else None

    def upload(self, *, progress: Progress | None = None,
               stop: threading.Event | None = None) -> int:
        """Put every blob the store lacks (or holds at another size); bytes uploaded."""
        store = self.ctx.store
        missing = sorted(store.missing_blobs(self.sizes))
        progress = progress or NoProgress()
        progress.start("uploading", sum(self.sizes[d] for d in missing))

        def put(digest: Digest) -> None:
            if stop is not None and stop.is_set():
                return
            store.put_blob(digest, self.sources[digest], progress=progress.advance, stop=stop)

        with Workers(WORKERS, name="upload") as pool:
            list(pool.map(put, missing))
        progress.finish()
        self.uploaded = missing
        return sum(self.sizes[d] for d in missing)

    def restore(self) -> list[Digest]:
        """Upload again every blob that is no longer in the store (at its size)."""
        gone = sorted(self.ctx.store.missing_blobs(self.sizes))
        for digest in gone:
            self.ctx.store.put_blob(digest, self.sources[digest])
        return gone

    @contextmanager
    def committing(self, *, also: Callable[[], None] | None = None) -> Iterator[Connection]:
        """A write transaction (a Core connection: `registry.sql.rows.Executor`) for the rows
        that reference the blobs, opened under the gc lock
        (shared) once *also* (e.g. the manifest, or what a publish whose row was lost
        checks) is done and every blob is in the store again; the pending row is dropped in
        the same transaction."""
        with self.ctx.registry.gc_lock(shared=True):
            if also is not None:
                also()
            self.restore()
            with self.ctx.registry.connection() as session:
                yield session
                drop_pending(session, self.id)
        self.committed = True
        self._stop_renewing()

    def end(self) -> None:
        """Stop renewing and drop the row if it is still there (an aborted publish)."""
        self._stop_renewing()
        if not self.committed:
            with self.ctx.registry.connection() as session:
                drop_pending(session, self.id)

    def _stop_renewing(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
