"""Whether refit-equivalence evidence holds for a weight-stripped engine's (model, quant,
TensorRT-LLM version) on its GPU (`registry.sql.refit_evidence` says what the evidence is):
one decision over plain values, which the ORM's road (`refit_evidence.equivalence_for`, the
smoke that may make a stripped engine `ready`) and the driver's (`registry.sql.showing`, for
`show`) share without either importing the other's database library."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol, TypeVar

KIND: Final = "refit-equivalence"


class EvidenceRow(Protocol):
    """What the decision reads of an evidence artifact's row."""

    @property
    def digest(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def status_reason(self) -> str | None: ...
    @property
    def toolchain(self) -> dict[str, Any]: ...


Row = TypeVar("Row", bound=EvidenceRow)


def newest_equivalence(candidates: Iterable[Row], trtllm: str | None) -> Row | None:
    """Of *candidates* (the tuple's `refit-equivalence` artifacts, oldest first), the newest
    one of TensorRT-LLM *trtllm* that held (`ready`) or was refuted (`quarantined`)."""
    found = [r for r in candidates
             if r.toolchain.get("trtllm") == trtllm and r.status in ("ready", "quarantined")]
    return found[-1] if found else None


def held_back(record: EvidenceRow | None, *, model: str | None, quant: str | None,
              gpu: str | None, trtllm: str | None) -> str | None:
    """Why a stripped engine of that tuple stays `built` (None: the evidence holds)."""
    if record is not None and record.status == "ready":
        return None
    tuple_said = f"{model} {quant} with TensorRT-LLM {trtllm} on {gpu}"
    if record is None:
        return f"no refit-equivalence evidence for {tuple_said} yet"
    return (f"refit-equivalence of {tuple_said} failed ({record.digest[:19]}: "
            f"{record.status_reason}); rebuild with --force to compare again")
