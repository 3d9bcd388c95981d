"""gc: remove blobs nothing references and the manifests of deleted artifacts.

Kept, always: every blob of an artifact that is not deleted (ready, aliased or otherwise),
every blob of a manifest in the store that the registry does not list (it may be a publish
in progress, or waiting for `reindex`), and every blob younger than the grace period (a
publish in progress uploads blobs before its manifest). What killed writers left half-written
(temp files, unfinished S3 multipart uploads, and this machine's fetch-cache temp entries)
goes too, once older than the grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from registry import records
from registry.digest import Digest
from registry.errors import IntegrityError, ManifestError, NotFoundError
from registry.fetch import load_manifest

if TYPE_CHECKING:
    from registry.context import Context


@dataclass
class Collected:
    blobs: list[Digest] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    unregistered_manifests: list[str] = field(default_factory=list)
    partial: int = 0
    """What killed writers left: temp files, unfinished multipart uploads, cache temp entries."""


def gc(ctx: Context, *, grace: timedelta = timedelta(days=7), dry_run: bool = False,
       now: datetime | None = None) -> Collected:
    now = now or datetime.now(UTC)
    result = Collected()
    with ctx.registry.session(readonly=True) as session:
        live = records.referenced_digests(session)
        keep = {Digest.parse(d) for d in records.referenced_blobs(session)}
        deleted = {r.digest for r in records.list_artifacts(session, status="deleted")}
    for digest in ctx.store.iter_manifests():
        text = str(digest)
        if text in live:
            continue
        if text in deleted:
            result.manifests.append(text)
            continue
        result.unregistered_manifests.append(text)
        try:
            keep |= {f.xxh3 for f in load_manifest(ctx, text).files}
        except (NotFoundError, IntegrityError, ManifestError):
            continue
    cutoff = now - grace
    result.partial = ctx.store.remove_partial(cutoff, dry_run=dry_run)
    result.partial += ctx.cache.remove_partial(cutoff, dry_run=dry_run)
    for blob in ctx.store.iter_blobs():
        if blob.digest not in keep and blob.modified < cutoff:
            result.blobs.append(blob.digest)
            result.bytes_freed += blob.size
    if not dry_run:
        for manifest in result.manifests:
            ctx.store.delete_manifest(Digest.parse(manifest))
        for blob_digest in result.blobs:
            ctx.store.delete_blob(blob_digest)
    return result
