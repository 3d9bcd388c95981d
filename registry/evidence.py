"""Evidence: where an artifact was proven to serve — the best passing smoke throughput per
GPU SKU (or "CPU"), as `registry.records.add_smoke_report` keeps it in `artifact_evidence`.

Reads only, inside the caller's transaction, as plain dataclasses (like `registry.records`).
`registry.resolve` reads the node's own row in its query; `ls` and `show` list them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.models import Artifact
from registry.models import ArtifactEvidence as EvidenceRow


@dataclass(frozen=True, slots=True)
class Evidence:
    """The best passing smoke throughput of one artifact on one GPU SKU (or "CPU")."""

    digest: str
    gpu: str
    best_tokens_per_s: float | None
    passed_at: datetime


def evidence_for(session: Session, digests: list[str]) -> dict[str, list[Evidence]]:
    """For each of *digests*, its passing evidence per GPU, ordered by GPU name; one query
    per 500 digests. A digest with none (never smoked, or only by an enginectl older than
    schema 0003) maps to an empty list."""
    found: dict[str, list[Evidence]] = {digest: [] for digest in digests}
    if not digests:
        return found
    query = (
        select(Artifact.digest, EvidenceRow.gpu, EvidenceRow.best_tokens_per_s,
               EvidenceRow.passed_at)
        .join(EvidenceRow, EvidenceRow.artifact_id == Artifact.id)
        .order_by(Artifact.digest, EvidenceRow.gpu)
    )
    ordered = sorted(set(digests))
    for first in range(0, len(ordered), 500):  # bound the parameters of one statement
        chunk = ordered[first:first + 500]
        for row in session.execute(query.where(Artifact.digest.in_(chunk))):
            found[row.digest].append(Evidence(*row))
    return found
