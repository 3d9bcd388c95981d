"""reindex: rebuild an empty registry from the store's manifests (the bucket is the truth).

Artifacts come back `built`: smoke evidence and aliases live in the registry, not the store,
so nothing is `ready` again until it is smoke-tested.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry import records
from registry.errors import UsageError
from registry.fetch import load_manifest
from registry.publish import record_of

if TYPE_CHECKING:
    from registry.context import Context


def reindex(ctx: Context) -> int:
    """Register every manifest in the store; returns how many. Refuses a non-empty registry."""
    with ctx.registry.session(readonly=True) as session:
        if records.list_artifacts(session):
            raise UsageError("the registry is not empty; reindex only rebuilds an empty one")
    count = 0
    for digest in sorted(ctx.store.iter_manifests()):
        manifest = load_manifest(ctx, str(digest))
        record = record_of(manifest, status="built", status_reason="reindexed from the store")
        with ctx.registry.session() as session:
            count += records.add_artifact_if_absent(session, record)
    return count
