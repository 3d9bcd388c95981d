"""Evidence: which proof an artifact is ranked by on a node, decided in pure code.

`nearest`: what `registry.ops.resolve` ranks by — of the passing proofs on the node's SKU
(`Proof`, as `registry.sql.resolving` reads them from `smoke_reports`), the latest on the
fingerprint the node has now, or the nearest one, said as such (`Used`): same SKU and driver
branch before same SKU only. Never the best number ever recorded. Where an artifact passed at
all is `artifact_evidence`, kept by `registry.sql.smoke_records.add_smoke_report` and read on
the driver (`registry.sql.resolving`, `registry.sql.listing`). No SQLAlchemy, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

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
