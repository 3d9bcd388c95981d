"""Refit equivalence: the evidence that weight-stripped engines, refitted, serve as whole ones.

The first stripped engine of a (model, quant, TensorRT-LLM version) on a GPU SKU is also built
whole on the same node, in the same run, and the two are served and compared (identical greedy
outputs on the smoke prompts, speed no worse by the promotion gate's rule); the comparison is
stored as an artifact of kind `refit-equivalence` (`ready` when it held, `quarantined` when
not) with the model, quant and GPU as labels and the TensorRT-LLM version in its toolchain.
`equivalence_for` is the one lookup: the smoke that decides whether a stripped engine may be
`ready`, and `show`, ask it the same question. Reads only, inside the caller's transaction.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.orm import Session

from registry.sql import records

KIND: Final = "refit-equivalence"


def equivalence_for(session: Session, *, model: str | None, quant: str | None,
                    gpu: str | None, trtllm: str | None) -> records.ArtifactRecord | None:
    """The newest refit-equivalence evidence of (*model*, *quant*, *trtllm*) on *gpu*, held
    (`ready`) or refuted (`quarantined`); None when there is none."""
    found = [r for r in records.list_artifacts(session, model=model, gpu=gpu, kind=KIND,
                                               quant=quant)
             if r.toolchain.get("trtllm") == trtllm and r.status in ("ready", "quarantined")]
    return found[-1] if found else None


def held_back(record: records.ArtifactRecord | None, *, model: str | None, quant: str | None,
              gpu: str | None, trtllm: str | None) -> str | None:
    """Why a stripped engine of that tuple stays `built` (None: the evidence holds)."""
    if record is not None and record.status == "ready":
        return None
    tuple_said = f"{model} {quant} with TensorRT-LLM {trtllm} on {gpu}"
    if record is None:
        return f"no refit-equivalence evidence for {tuple_said} yet"
    return (f"refit-equivalence of {tuple_said} failed ({record.digest[:19]}: "
            f"{record.status_reason}); rebuild with --force to compare again")


def refit_sources(session: Session) -> dict[str, list[str]]:
    """The checkpoints that weight-stripped engines not deleted are refitted from (their
    `refit_source` label): checkpoint digest -> those engines. gc keeps them, whatever their
    own status, and fsck checks them."""
    needed: dict[str, list[str]] = {}
    for record in records.list_artifacts(session, kind="trtllm-engine"):
        source = record.labels.get("refit_source")
        if record.status != "deleted" and record.labels.get("strip_plan") is True \
                and isinstance(source, str):
            needed.setdefault(source, []).append(record.digest)
    return needed
