"""What `inventory.show` and `ls` answered through the ORM before they read on the driver
(`registry.sql.listing`, `registry.sql.showing`): the reference their tests hold them to."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.context import Context
from registry.ops.fetch import load_manifest
from registry.sql import alias_records, leases, records, refit_evidence, smoke_records
from registry.sql.alias_records import pinned_by_rollback
from registry.sql.models import Artifact
from registry.sql.models import ArtifactEvidence as EvidenceRow
from registry.sql.records import ArtifactRecord
from registry.sql.refit_verdict import held_back
from registry.sql.refs import resolve_ref


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


def artifact_dict(record: ArtifactRecord, aliases: list[str]) -> dict[str, Any]:
    data = asdict(record)
    data.pop("files")
    for name in ("created_at", "updated_at"):
        if data[name] is not None:
            data[name] = data[name].isoformat()
    return data | {"aliases": aliases}


def _evidence(found: list[Evidence]) -> list[dict[str, Any]]:
    return [{"gpu": e.gpu, "best_tokens_per_s": e.best_tokens_per_s,
             "passed_at": e.passed_at.isoformat()} for e in found]


def show_through_the_orm(ctx: Context, ref: str) -> dict[str, Any]:
    with ctx.registry.session(readonly=True) as session:
        digest = resolve_ref(session, ref)
        record = records.get_artifact(session, digest)
        assert record is not None
        aliases = alias_records.aliases_for(session, digest)
        reports = [
            {"passed": r.passed, "created_at": r.created_at.isoformat(), "gpu": r.gpu,
             "toolchain": r.toolchain, "key": r.key, "report": r.report}
            for r in smoke_records.smoke_reports(session, digest)
        ]
        evidence = _evidence(evidence_for(session, [digest])[digest])
        history = {name: [
            {"digest": e.digest, "previous": e.previous_digest, "at": e.at.isoformat(),
             "note": e.note, "details": e.details}
            for e in alias_records.alias_history(session, name)
        ] for name in aliases}
        pins = [pin.as_dict() for name in aliases
                if (pin := pinned_by_rollback(session, name)) is not None]
        manifest = load_manifest(ctx, digest)
        warm = [{"digest": r.digest, "status": r.status, "gpu": r.gpu, "toolchain": r.toolchain,
                 "size": r.size, "created_at": r.created_at.isoformat() if r.created_at else None}
                for r in records.list_artifacts(session, model=record.model, kind="warm-cache")
                if r.labels.get("artifact") == digest and r.status != "deleted"]
        run = leases.get_stage_run(session, record.key) if record.key else None
        provenance = _provenance(ctx, session, manifest.inputs, seen={digest})
        refit = None
        if record.labels.get("strip_plan") is True:
            tuple_of = {"model": record.model, "quant": record.quant, "gpu": record.gpu,
                        "trtllm": record.toolchain.get("trtllm")}
            found = refit_evidence.equivalence_for(session, **tuple_of)
            refit = {"refit_source": record.labels.get("refit_source"),
                     "evidence": None if found is None else found.digest,
                     "holds": found is not None and found.status == "ready",
                     "held_back": held_back(found, **tuple_of)}
    return {
        "artifact": artifact_dict(record, aliases),
        "manifest": manifest.as_dict(),
        "alias_history": history,
        "pins": pins,
        "smoke_reports": reports,
        "evidence": evidence,
        "provenance": provenance,
        "warm_caches": warm,
        "refit_equivalence": refit,
        "stage_run": None if run is None else {
            "status": run.status, "host": run.host, "node_id": run.node_id, "pid": run.pid,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "log": run.log_location, "recipe_digest": record.recipe_digest,
        },
    }


def _provenance(ctx: Context, session: Any, inputs: tuple[str, ...],
                seen: set[str]) -> list[dict[str, Any]]:
    from registry.errors import NotFoundError

    tree = []
    for digest in sorted(inputs):
        record = records.get_artifact(session, digest)
        node: dict[str, Any] = {"digest": digest, "kind": record.kind if record else None,
                                "key": record.key if record else None}
        if digest not in seen:
            try:
                parents = load_manifest(ctx, digest).inputs
            except NotFoundError:
                parents = ()
            node["inputs"] = _provenance(ctx, session, parents, seen | {digest})
        tree.append(node)
    return tree
