"""The warm caches the registry lists for one artifact, read on the database driver alone
(`registry.sql.lookup`'s reader): `pull` asks this before it places an artifact, and a pull
never imports SQLAlchemy.

A warm cache is an artifact of kind `warm-cache` whose `artifact` label is the digest of the
artifact whose server wrote it (`pipeline.serving.warm`); its `key` is the exact match a node
needs, and its `gpu` and `toolchain` say where it was captured, so that a miss can say which
part differs.
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


def warm_caches(url: str, model: str, artifact: str) -> list[WarmRow]:
    """The warm caches of *artifact* (a model's *model*) that are not deleted, oldest first."""
    with open_reader(url) as reader:
        rows = reader.rows(
            "SELECT digest, key, status, gpu, toolchain, labels FROM artifacts WHERE "
            "kind = 'warm-cache' AND model = ? AND status NOT IN ('deleted', 'quarantined') "
            "ORDER BY created_at, id", model)
    return [WarmRow(str(digest), key, str(status), gpu, json_column(toolchain))
            for digest, key, status, gpu, toolchain, labels in rows
            if json_column(labels).get("artifact") == artifact]
