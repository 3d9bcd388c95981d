"""The warm caches the registry lists for one artifact, read on the database driver alone
(`registry.sql.lookup`'s reader): `pull` asks this before it places an artifact, and a pull
never imports SQLAlchemy.

A warm cache is an artifact of kind `warm-cache` whose `artifact` label is the digest of the
artifact whose server wrote it (`pipeline.serving.warm`); its `key` is the exact match a node
needs (which the caller checks again against the cache's own manifest), and its `gpu` and
`toolchain` say where it was captured, so that a miss can say which part differs. One that is
`quarantined` (refused: a server failed with it and passed without it) is never listed.
`used` is what the runtime did with the cache at the artifact's last smoke that started from
it, as that smoke's report says (`warm_use`: "used", or "placed, not used (why)").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.sql.lookup import json_column, open_reader


@dataclass(frozen=True)
class WarmRow:
    digest: str
    key: str | None
    status: str
    gpu: str | None
    toolchain: dict[str, Any]
    used: str | None = None


def warm_caches(url: str, model: str, artifact: str) -> list[WarmRow]:
    """The warm caches of *artifact* (a model's *model*) that are neither deleted nor
    refused, oldest first."""
    with open_reader(url) as reader:
        rows = reader.rows(
            "SELECT digest, key, status, gpu, toolchain, labels FROM artifacts WHERE "
            "kind = 'warm-cache' AND model = ? AND status NOT IN ('deleted', 'quarantined') "
            "ORDER BY created_at, id", model)
        reports = reader.rows(
            "SELECT s.report FROM smoke_reports s JOIN artifacts a ON s.artifact_id = a.id "
            "WHERE a.digest = ? ORDER BY s.created_at, s.id", artifact) if rows else []
    used: dict[str, str] = {}
    for (report,) in reports:
        found = json_column(report)
        if isinstance(found.get("warm_cache"), str) and isinstance(found.get("warm_use"), str):
            used[found["warm_cache"]] = found["warm_use"]
    return [WarmRow(str(digest), key, str(status), gpu, json_column(toolchain),
                    used.get(str(digest)))
            for digest, key, status, gpu, toolchain, labels in rows
            if json_column(labels).get("artifact") == artifact]
