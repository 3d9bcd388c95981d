"""Refit equivalence: the evidence that weight-stripped engines, refitted, serve as whole ones.

The first stripped engine of a (model, quant, TensorRT-LLM version) on a GPU SKU is also built
whole on the same node, in the same run, and the two are served and compared (identical greedy
outputs on the smoke prompts, speed no worse by the promotion gate's rule); the comparison is
stored as an artifact of kind `refit-equivalence` (`ready` when it held, `quarantined` when
not) with the model, quant and GPU as labels and the TensorRT-LLM version in its toolchain.
`equivalence_for` is the ORM's lookup (the smoke that decides whether a stripped engine may be
`ready` asks it); `show` reads on the driver; both decide through `registry.sql.refit_verdict`.
Reads only, inside the caller's transaction.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from registry.sql import records
from registry.sql.refit_verdict import KIND, newest_equivalence


def equivalence_for(session: Session, *, model: str | None, quant: str | None,
                    gpu: str | None, trtllm: str | None) -> records.ArtifactRecord | None:
    """The newest refit-equivalence evidence of (*model*, *quant*, *trtllm*) on *gpu*, held
    (`ready`) or refuted (`quarantined`); None when there is none
    (`registry.sql.refit_verdict` decides)."""
    return newest_equivalence(records.list_artifacts(session, model=model, gpu=gpu, kind=KIND,
                                                     quant=quant), trtllm)


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
