"""Evidence: where an artifact was proven to serve.

- `gpus_proven`: the GPU SKUs (or "CPU") each artifact passed a smoke on, as
  `registry.sql.smoke_records.add_smoke_report` keeps them in `artifact_evidence` (`ls` and
  `show` read the same table on the driver: `registry.sql.listing`).
- `proofs_on` and `nearest`: what `registry.ops.resolve` ranks by — the latest passing proof on
  the fingerprint the node has now, or the nearest one, said as such (`Used`): same SKU and
  driver branch before same SKU only. Never the best number ever recorded.

Reads only, inside the caller's transaction, as plain dataclasses (like `registry.sql.records`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from registry.sql.models import ArtifactEvidence as EvidenceRow
from registry.sql.models import SmokeReportRow


def gpus_proven(session: Session, artifacts: Mapping[int, str]) -> dict[str, list[str]]:
    """The GPUs (or "CPU") each of *artifacts* (row id -> digest) passed a smoke on, by
    name, by digest: `artifact_evidence`'s rows by row id, one query per 500 (resolve's words)."""
    found: dict[str, list[str]] = {}
    ids = sorted(artifacts)
    connection = session.connection()  # Core's execution alone, as in proofs_on
    query = _gpus_query(connection.dialect.name == "postgresql")
    for first in range(0, len(ids), 500):  # bound the parameters of one statement
        for artifact_id, gpu in connection.execute(query, {"ids": ids[first:first + 500]}):
            found.setdefault(artifacts[artifact_id], []).append(gpu)
    return found


@functools.cache
def _gpus_query(postgresql: bool) -> Select[Any]:
    """`gpus_proven`'s statement; the ids as `_proofs_query` takes them: on PostgreSQL a
    probe of the primary key per id whatever the statistics, on SQLite one JSON array."""
    if not postgresql:
        return (select(EvidenceRow.artifact_id, EvidenceRow.gpu)
                .where(EvidenceRow.artifact_id.in_(_sqlite_ids()))
                .order_by(EvidenceRow.artifact_id, EvidenceRow.gpu))
    from sqlalchemy import true

    wanted = _postgresql_ids()
    probe = (select(EvidenceRow.artifact_id, EvidenceRow.gpu)
             .where(EvidenceRow.artifact_id == wanted.c.id)
             .offset(0)  # a fence, as in _proofs_query
             .lateral("probe"))
    return (select(probe.c.artifact_id, probe.c.gpu).select_from(wanted).join(probe, true())
            .order_by(probe.c.artifact_id, probe.c.gpu))


def _sqlite_ids() -> Select[Any]:
    """The `ids` parameter (a list of row ids) as a subquery: one JSON array on SQLite."""
    from sqlalchemy import JSON, func

    each = func.json_each(bindparam("ids", type_=JSON)).table_valued("value")
    return select(each.c.value)


def _postgresql_ids() -> Any:
    """The `ids` parameter (a list of row ids) as a table `wanted(id)`: one array."""
    from sqlalchemy import Integer, func
    from sqlalchemy.dialects.postgresql import ARRAY

    return (func.unnest(bindparam("ids", type_=ARRAY(Integer))).table_valued("id")
            .render_derived(name="wanted"))


# --- the evidence resolve ranks by: the latest proof on the node's fingerprint, or the nearest

# The fingerprint fields a proof of each servable kind is compared on (the driver, and the
# runtime that serves it); a field the node does not report is not compared.
MATCH_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "trtllm-engine": ("driver", "cuda", "tensorrt", "trtllm"),
    "trtllm-checkpoint": ("driver", "cuda", "trtllm"),
    "vllm": ("driver", "vllm"),
}
FINGERPRINT_FIELDS: Final = ("driver", "cuda", "tensorrt", "trtllm", "vllm")
# How near a proof is, best first; the index is the rank resolve sorts by.
MATCHES: Final = ("fingerprint", "driver branch", "sku", "none")
Match = Literal["fingerprint", "driver branch", "sku", "none"]


@dataclass(frozen=True, slots=True)
class Proof:
    """One passing smoke report: where and when, its best throughput, and the fingerprint
    fields (`FINGERPRINT_FIELDS`) it ran with (None: not recorded)."""

    digest: str
    gpu: str
    at: datetime
    tokens_per_s: float | None
    toolchain: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class Used:
    """The proof resolve ranked an artifact by, and how near it is to the node's
    fingerprint: `fingerprint` (every field the node reports agrees), else the nearest:
    `driver branch` (same SKU and driver branch, e.g. 570.x), `sku` (same SKU only), or
    `none` (no passing report on the node's SKU)."""

    match: Match
    proof: Proof | None = None
    differs: tuple[str, ...] = ()  # "driver 570.124.06 → 575.57.08": proof → node

    @property
    def rank(self) -> int:
        return MATCHES.index(self.match)

    def as_dict(self) -> dict[str, Any]:
        proof = self.proof
        return {
            "match": "this fingerprint" if self.match == "fingerprint"
            else "none" if self.match == "none" else "nearest",
            "nearest_by": None if self.match in ("fingerprint", "none") else self.match,
            "gpu": proof.gpu if proof else None,
            "at": proof.at.isoformat() if proof else None,
            "tokens_per_s": proof.tokens_per_s if proof else None,
            "toolchain": dict(proof.toolchain) if proof else None,
            "differs": list(self.differs),
        }


NO_PROOF: Final = Used("none")


def _branch(driver: str | None) -> str | None:
    return driver.split(".")[0] if driver else None


def nearest(proofs: list[Proof], kind: str, node: Mapping[str, Any]) -> Used:
    """The latest of *proofs* (passing reports on the node's SKU, oldest first) at the
    nearest match to *node*'s fingerprint (`Used`). Pure."""
    if not proofs:  # most of resolve's rows
        return NO_PROOF
    fields = MATCH_FIELDS.get(kind, FINGERPRINT_FIELDS)
    known = {name: str(node[name]) for name in fields if node.get(name)}
    best = Used("none")
    for proof in proofs:
        differs = tuple(f"{name} {proof.toolchain.get(name) or '?'} → {value}"
                        for name, value in known.items() if proof.toolchain.get(name) != value)
        match: Match = "fingerprint" if not differs else "driver branch" if (
            known.get("driver") and _branch(proof.toolchain.get("driver"))
            == _branch(known["driver"])) else "sku"
        if MATCHES.index(match) <= best.rank:  # oldest first: the latest at a level wins
            best = Used(match, proof, differs)
    return best


def proofs_on(session: Session, artifacts: Mapping[int, str],
              gpu: str) -> dict[str, list[Proof]]:
    """The passing smoke reports measured on *gpu* of *artifacts* (row id -> digest: the
    candidates resolve read), oldest first, by digest: one query per 500 artifacts, an index
    probe per artifact (`smoke_reports.artifact_id`) whatever the planner's statistics say
    (`_proofs_query`), the fingerprint fields and the throughput read out of the JSON by the
    database."""
    found: dict[str, list[Proof]] = {}
    ids = sorted(artifacts)
    connection = session.connection()  # Core's execution alone, not the ORM's around it
    query = _proofs_query(connection.dialect.name == "postgresql")
    for first in range(0, len(ids), 500):  # bound the parameters of one statement
        rows = connection.execute(query, {"ids": ids[first:first + 500], "gpu": gpu})
        for artifact_id, at, tokens, *values in rows:
            found.setdefault(artifacts[artifact_id], []).append(
                Proof(artifacts[artifact_id], gpu, at, tokens,
                      dict(zip(FINGERPRINT_FIELDS, values, strict=True))))
    return found


@functools.cache
def _proofs_query(postgresql: bool) -> Select[Any]:
    """`proofs_on`'s statement, built once (SQLAlchemy then reuses its compiled form).

    On PostgreSQL a LATERAL subquery per wanted id: `artifact_id IN (…ids)` on a table not
    analysed yet (just after a bulk load) is estimated at 0.5 % of the table per id, and ~90
    ids made the planner scan all of smoke_reports (9 ms at 33,000 reports, ~100 at 337,000);
    a lateral probe per id is an index scan on any statistics. On SQLite the ids are one
    JSON array (`json_each`), so the statement's text is the same for any number of ids
    (prepared once; an expanding IN list is rendered and prepared again on every call),
    each an index probe."""
    report, toolchain = SmokeReportRow.report, SmokeReportRow.toolchain
    fields = (SmokeReportRow.artifact_id, SmokeReportRow.created_at,
              report["best_output_tokens_per_s"].as_float(),
              *(toolchain[name].as_string() for name in FINGERPRINT_FIELDS))
    passed_on = (SmokeReportRow.gpu == bindparam("gpu"), SmokeReportRow.passed.is_(True))
    if not postgresql:
        return (select(*fields)
                .where(SmokeReportRow.artifact_id.in_(_sqlite_ids()), *passed_on)
                .order_by(SmokeReportRow.created_at, SmokeReportRow.id))
    from sqlalchemy import true

    wanted = _postgresql_ids()
    proof = (select(*(f.label(f"f{n}") for n, f in enumerate(fields)),
                    SmokeReportRow.id.label("report_id"))
             .where(SmokeReportRow.artifact_id == wanted.c.id, *passed_on)
             .offset(0)  # a fence: else the planner flattens it into a join it may hash
             .lateral("proof"))
    columns = [proof.c[f"f{n}"] for n in range(len(fields))]
    return (select(*columns).select_from(wanted).join(proof, true())
            .order_by(proof.c.f1, proof.c.report_id))
