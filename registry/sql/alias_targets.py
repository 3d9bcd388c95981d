"""What an alias has pointed at, read on the database driver alone (like `registry.sql.lookup`,
so that `pull ALIAS` stays off SQLAlchemy): each target, newest first, with its kind, status,
the toolchain it was built with, and the toolchains of its passing smoke reports.
`registry.ops.alias_fit` decides which of them a node can run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from registry.config import REGISTRY_RETRY_DEFAULT_S
from registry.sql.lookup import HEAD, json_column, open_reader

_TARGETS = (
    "SELECT e.id, e.digest, e.at, a.kind, a.status, a.toolchain, s.toolchain "
    "FROM alias_events e "
    "JOIN artifacts a ON a.digest = e.digest "
    "LEFT JOIN smoke_reports s ON s.artifact_id = a.id AND s.passed = TRUE "
    "WHERE e.name = ? ORDER BY e.id DESC, s.id"
)


@dataclass(frozen=True)
class Target:
    """One artifact an alias pointed at: since when (its latest move there), what it is, and
    the toolchains it was proven on (the passing smoke reports', oldest first)."""

    digest: str
    since: datetime | None
    kind: str
    status: str
    built: dict[str, Any] = field(default_factory=dict)
    proofs: list[dict[str, Any]] = field(default_factory=list)


def _when(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def alias_targets(url: str, name: str, *,
                  retry_s: float = REGISTRY_RETRY_DEFAULT_S) -> list[Target]:
    """Every artifact alias *name* pointed at, newest first, one query; [] for a registry not
    at the schema head (smoke reports say where they ran only from 0003 on) or without one.
    A connection fault is retried for *retry_s*."""
    with open_reader(url, retry_s) as found:
        if found.revision() != HEAD:
            return []
        targets: dict[str, Target] = {}
        latest: dict[str, Any] = {}  # per digest, the id of its newest event (its proofs)
        for event, digest, at, kind, status, built, proof in found.rows(_TARGETS, name):
            if latest.setdefault(digest, event) != event:
                continue  # an older move to the same digest: the same proofs again
            target = targets.setdefault(digest, Target(digest, _when(at), kind, status,
                                                       json_column(built)))
            if proof is not None:
                target.proofs.append(json_column(proof))
        return list(targets.values())
