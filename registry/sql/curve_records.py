"""The passing proofs of a model with what `advise` reads from them: where and when each
was measured, its fingerprint, the price it was costed at and its capacity curve (the
`capacity` field of the report's JSON, kept in the store's records like the rest of the
report), and the newest probed fingerprint of each GPU SKU's pools.

Reads only, inside the caller's transaction, as plain dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.sql.evidence import FINGERPRINT_FIELDS
from registry.sql.models import Artifact, SmokeReportRow, ToolchainRow


@dataclass(frozen=True, slots=True)
class CurveProof:
    """One passing smoke report of a servable artifact (its row's labels alongside)."""

    digest: str
    kind: str
    status: str
    quant: str | None
    tp: int
    pp: int
    built_for: str | None  # the artifact's GPU column (engines); None for entries
    gpu: str  # where the report was measured: a catalog SKU or "CPU"
    at: datetime
    toolchain: dict[str, str | None]  # FINGERPRINT_FIELDS, None where not recorded
    tokens_per_s: float | None
    price_per_hour: float | None
    curve: Any  # the report's `capacity` JSON, None when it has none


def curve_proofs(session: Session, model: str, kinds: tuple[str, ...]) -> list[CurveProof]:
    """Every passing report with a known GPU of *model*'s artifacts of *kinds* that are not
    deleted, oldest first: one query."""
    report, toolchain = SmokeReportRow.report, SmokeReportRow.toolchain
    query = (
        select(Artifact.digest, Artifact.kind, Artifact.status, Artifact.quant, Artifact.tp,
               Artifact.pp, Artifact.gpu, SmokeReportRow.gpu, SmokeReportRow.created_at,
               report["best_output_tokens_per_s"].as_float(),
               report["price_per_hour"].as_float(), report["capacity"],
               *(toolchain[name].as_string() for name in FINGERPRINT_FIELDS))
        .join(SmokeReportRow, SmokeReportRow.artifact_id == Artifact.id)
        .where(Artifact.model == model, Artifact.kind.in_(kinds),
               Artifact.status != "deleted", SmokeReportRow.passed.is_(True),
               SmokeReportRow.gpu.is_not(None))
        .order_by(SmokeReportRow.created_at, SmokeReportRow.id)
    )
    found = []
    for (digest, kind, status, quant, tp, pp, built_for, gpu, at, tokens, price, curve,
         *values) in session.execute(query):
        found.append(CurveProof(
            digest, kind, status, quant, tp or 1, pp or 1, built_for, gpu, at,
            dict(zip(FINGERPRINT_FIELDS, values, strict=True)), tokens, price, curve))
    return found


def current_fingerprints(session: Session) -> dict[str, dict[str, Any]]:
    """Per GPU SKU (or "CPU"), the fingerprint of the newest probe of any of its pools
    (`enginectl nightly` and the executors record them); a SKU never probed is absent."""
    query = (select(ToolchainRow.gpu, ToolchainRow.fingerprint)
             .order_by(ToolchainRow.probed_at, ToolchainRow.id))
    return {gpu: dict(fingerprint or {}) for gpu, fingerprint in session.execute(query)}

