"""gc: remove blobs nothing references and the manifests of deleted artifacts.

Kept, always:

- every blob of an artifact that is not deleted (ready, aliased or otherwise);
- every blob and the manifest of an artifact an alias points at, and of the last
  `keep_superseded` (default 3) others each alias pointed at before (alias history: what was
  prod stays fetchable by digest, and `enginectl rollback` has somewhere to go), even once
  deleted;
- every blob and the manifest of the checkpoint a weight-stripped engine that is not deleted
  is refitted from (its `refit_source`), even once that checkpoint is deleted;
- every blob history references: stage run logs (`stage_runs.log_location`) and smoke logs
  (a smoke report's `log`), which `enginectl logs` reads;
- every blob of a publish in progress (a live `pending_publishes` row);
- every blob of a manifest in the store that the registry does not list (a publish about to
  register, or a store waiting for `reindex`);
- every blob younger than the grace period.

What killed writers left half-written (temp files, unfinished S3 multipart uploads, and this
machine's fetch-cache temp entries), objects set aside under `damaged/`, and the rows of
pending publishes that expired go too, once older than the grace period; a half-written blob
of a publish in flight is not a killed writer's and stays, whatever the grace, and so does a
fetch-cache temp entry its writer still holds locked (a fetch in progress, however stalled:
`registry.store.cache`).

gc runs in two phases, `Collector.mark` and `Collector.sweep`, under the registry's gc lock
held exclusively (`registry.sql.gclock`): no publish registers in between, and a publish that
began meanwhile puts back, under the same lock, any blob the sweep took (`registry.ops.pending`).
Records (`records/`, `aliases/`) are history and are never collected.

A `superseded` artifact (a promotion replaced it) beyond that window is retired first: it
becomes `deleted` (recorded in the store, as every status change), and its blobs go with the
rest; so does every warm cache of an artifact that is deleted (`pipeline.serving.warm`: a warm
cache is only ever used with its artifact). With --dry-run they are only listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from registry.errors import IntegrityError, ManifestError, NotFoundError, UsageError
from registry.identity.digest import Digest
from registry.ops.damage import iter_damaged
from registry.ops.fetch import load_manifest
from registry.sql import alias_records, records
from registry.sql.pending_publishes import drop_expired, live_pending_blobs
from registry.sql.refit_evidence import refit_sources

if TYPE_CHECKING:
    from registry.context import Context

MAX_GRACE = timedelta(days=36500)
"""A grace period longer than this (a century) is refused: it would keep everything anyway,
and dates before year 1 do not exist."""


DEFAULT_KEEP_SUPERSEDED = 3
"""How many artifacts each alias pointed at before (besides its current one) gc keeps."""


@dataclass
class Collected:
    blobs: list[Digest] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    unregistered_manifests: list[str] = field(default_factory=list)
    partial: int = 0
    """What killed writers left: temp files, unfinished multipart uploads, cache temp entries."""
    damaged: list[str] = field(default_factory=list)
    """Keys of objects set aside as damaged (`damaged/…`) that were removed."""
    expired_publishes: int = 0
    """Rows of publishes that died before committing, now expired."""
    kept_in_flight: int = 0
    """Blobs kept only because a publish in progress relies on them."""
    kept_for_history: int = 0
    """Blobs kept only because history references them (logs, deleted but aliased once)."""
    retired: list[str] = field(default_factory=list)
    """Superseded artifacts beyond the alias history kept, made `deleted` (or, dry, to be)."""


def check_grace(grace: timedelta) -> timedelta:
    if grace < timedelta(0) or grace > MAX_GRACE:
        raise UsageError(f"--grace {grace.days}d is out of range: give 0s to 36500d")
    return grace


def parse_grace(text: str) -> timedelta:
    """`12h`, `7d`, `0s`, `30m` as a timedelta; UsageError (quoting *text*) otherwise, or
    beyond MAX_GRACE."""
    import re

    match = re.fullmatch(r"([0-9]+)([smhd])", text.strip())
    if match is None:
        raise UsageError(f"--grace {text!r}: expected a number and a unit, e.g. 12h or 7d")
    seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if seconds > MAX_GRACE.total_seconds():
        raise UsageError(f"--grace {text!r} is too long: at most 36500d (a century)")
    return timedelta(seconds=seconds)


class Collector:
    """One gc run in phases; `gc` holds the gc lock around `mark` and `sweep`."""

    def __init__(self, ctx: Context, *, grace: timedelta = timedelta(days=7),
                 dry_run: bool = False, now: datetime | None = None,
                 keep_superseded: int = DEFAULT_KEEP_SUPERSEDED) -> None:
        if keep_superseded < 0:
            raise UsageError(f"--keep-superseded {keep_superseded}: give 0 or more")
        self.ctx = ctx
        self.keep_superseded = keep_superseded
        self.dry_run = dry_run
        self.now = now or datetime.now(UTC)
        self.cutoff = self.now - check_grace(grace)
        self.result = Collected()
        self.keep: set[Digest] = set()

    def retire(self) -> None:
        """Superseded artifacts outside every alias's kept history become `deleted`."""
        from registry.ops import history

        with self.ctx.registry.session() as session:
            historic = alias_records.aliased_in_history(session, self.keep_superseded)
            retired = [r.digest for r in records.list_artifacts(session, status="superseded")
                       if r.digest not in historic]
            if not self.dry_run:
                for digest in retired:
                    history.set_status_and_record(self.ctx.store, session, digest, "deleted",
                                                  f"gc: superseded, past --keep-superseded "
                                                  f"{self.keep_superseded}")
            gone = set(retired) | {r.digest for r in records.list_artifacts(
                session, status="deleted") if r.digest not in historic}
            orphans = [r.digest for r in records.list_artifacts(session, kind="warm-cache")
                       if r.status != "deleted" and r.labels.get("artifact") in gone]
            if not self.dry_run:
                for digest in orphans:
                    history.set_status_and_record(self.ctx.store, session, digest, "deleted",
                                                  "gc: the artifact it was captured for is deleted")
        self.result.retired = retired + orphans

    def mark(self) -> None:
        """Decide what stays: every reference the registry and the store hold now."""
        ctx, result = self.ctx, self.result
        with ctx.registry.session(readonly=True) as session:
            live = records.referenced_digests(session)
            keep = {Digest.parse(d) for d in records.referenced_blobs(session)}
            historic = alias_records.aliased_in_history(session, self.keep_superseded)
            historic |= set(refit_sources(session))  # what stripped engines refit from
            kept_deleted = [r for r in records.list_artifacts(session, status="deleted")
                            if r.digest in historic]
            deleted = {r.digest for r in records.list_artifacts(session, status="deleted")}
            history = {Digest.parse(d) for d in records.history_blobs(session)}
            history |= {Digest.parse(f.xxh3) for r in kept_deleted for f in r.files}
            in_flight = live_pending_blobs(session, self.now)
        result.kept_for_history = len(history - keep)
        result.kept_in_flight = len(in_flight - keep - history)
        keep |= history | in_flight
        for digest in ctx.store.iter_manifests():
            text = str(digest)
            if text in live or text in historic:
                continue
            if text in deleted:
                result.manifests.append(text)
                continue
            result.unregistered_manifests.append(text)
            try:
                keep |= {f.xxh3 for f in load_manifest(ctx, text).files}
            except (NotFoundError, IntegrityError, ManifestError):
                continue
        self.keep = keep

    def _in_flight(self) -> set[Digest]:
        """The blobs of the publishes in flight now: their half-written uploads stay, at any
        grace. Asked after the store listed them, so the row of each (committed before its
        upload started, `registry.ops.pending`) is seen."""
        with self.ctx.registry.session(readonly=True) as session:
            return live_pending_blobs(session, datetime.now(UTC))

    def sweep(self) -> Collected:
        """Remove what `mark` left unreferenced and older than the grace period."""
        ctx, result, cutoff = self.ctx, self.result, self.cutoff
        result.partial = ctx.store.remove_partial(cutoff, dry_run=self.dry_run,
                                                  in_flight=self._in_flight)
        result.partial += ctx.cache.remove_partial(cutoff, dry_run=self.dry_run)
        for blob in ctx.store.iter_blobs():
            if blob.digest not in self.keep and blob.modified < cutoff:
                result.blobs.append(blob.digest)
                result.bytes_freed += blob.size
        result.damaged = [d.info.key for d in iter_damaged(ctx.store) if d.key.at < cutoff]
        if self.dry_run:
            return result
        for manifest in result.manifests:
            ctx.store.delete_manifest(Digest.parse(manifest))
        for blob_digest in result.blobs:
            ctx.store.delete_blob(blob_digest)
        for key in result.damaged:
            ctx.store.delete_object(key)
        with ctx.registry.session() as session:
            result.expired_publishes = drop_expired(session, cutoff)
        return result


def gc(ctx: Context, *, grace: timedelta = timedelta(days=7), dry_run: bool = False,
       now: datetime | None = None,
       keep_superseded: int = DEFAULT_KEEP_SUPERSEDED) -> Collected:
    """Collect the store (see the module doc) under the registry's gc lock."""
    collector = Collector(ctx, grace=grace, dry_run=dry_run, now=now,
                          keep_superseded=keep_superseded)
    with ctx.registry.gc_lock(shared=False):
        collector.retire()
        collector.mark()
        return collector.sweep()
