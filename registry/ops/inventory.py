"""ls and show: what the registry holds, with aliases, provenance and smoke reports.

`ls` reads on the database driver alone (`registry.sql.listing`), so it never imports
SQLAlchemy; a registry not at the schema head is refused as opening it for reading refuses
it. `show` reads through the ORM.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from registry.errors import NoRegistryError, RecordNotFoundError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from registry.context import Context
    from registry.sql.evidence import Evidence
    from registry.sql.records import ArtifactRecord


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


def _not_made_yet(ctx: Context, exc: NoRegistryError) -> bool:
    """Whether *exc* says only that the embedded default registry (the SQLite file in the
    home, no ENGINECTL_REGISTRY_URL) was not made yet: nothing was built or imported, which
    `ls` and `show` answer as an empty registry. A registry the user configured that is not
    there stays an error (exit 4): that one is a typo or an outage."""
    return exc.missing and not _configured(ctx)


def _configured(ctx: Context) -> bool:
    """Whether the registry's URL was given (ENGINECTL_REGISTRY_URL), not the home's default."""
    return "ENGINECTL_REGISTRY_URL" in ctx.config.origins.get("registry_url", "")


def ls(ctx: Context, **filters: str | None) -> list[dict[str, Any]]:
    """Artifacts matching the filters (model, gpu, kind, quant, status, alias), oldest first,
    each with the GPUs its smoke runs passed on (`evidence`); none before the embedded
    default registry was made (`_not_made_yet`)."""
    from registry.config import check_directory
    from registry.sql.listing import listed_artifacts

    if not _configured(ctx):  # as opening the registry checks it (`Context.registry`)
        check_directory(ctx.config.home, what="enginectl's home", variable="ENGINECTL_HOME")
    try:
        return listed_artifacts(ctx.config.registry_url, retry_s=ctx.config.registry_retry_s,
                                **filters)
    except NoRegistryError as exc:
        if _not_made_yet(ctx, exc):
            return []
        raise


def show(ctx: Context, ref: str) -> dict[str, Any]:
    """Everything known about one artifact (`RecordNotFoundError` when there is none, also
    before the embedded default registry was made): its row, manifest, aliases (and the rollbacks
    that pin them: `pins`), smoke reports, its warm caches (`warm_caches`: where each was
    captured), and its provenance as a tree of input artifacts down to the source
    checkpoint."""
    from registry.ops.fetch import load_manifest
    from registry.sql import alias_records, leases, records, smoke_records
    from registry.sql.alias_records import pinned_by_rollback
    from registry.sql.evidence import evidence_for
    from registry.sql.refs import resolve_ref

    try:
        ctx.registry  # noqa: B018 - opening it says whether there is one
    except NoRegistryError as exc:
        if _not_made_yet(ctx, exc):  # an empty registry: nothing is called *ref* (exit 6)
            raise RecordNotFoundError(
                "artifact or alias", ref, hint="nothing was built or imported yet: "
                "`enginectl build RECIPE` or `enginectl import DIR` adds one") from exc
        raise
    with ctx.registry.session(readonly=True) as session:
        digest = resolve_ref(session, ref)
        record = records.get_artifact(session, digest)
        assert record is not None  # noqa: S101 - resolve_ref only returns registered digests
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
        refit = _refit(session, record)
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


def _refit(session: Session, record: ArtifactRecord) -> dict[str, Any] | None:
    """A weight-stripped engine's refit source and the refit-equivalence evidence of its
    (model, quant, TRT-LLM) on its GPU (`registry.sql.refit_evidence`); None for others."""
    from registry.sql import refit_evidence

    if record.labels.get("strip_plan") is not True:
        return None
    tuple_of = {"model": record.model, "quant": record.quant, "gpu": record.gpu,
                "trtllm": record.toolchain.get("trtllm")}
    found = refit_evidence.equivalence_for(session, **tuple_of)
    return {"refit_source": record.labels.get("refit_source"),
            "evidence": None if found is None else found.digest,
            "holds": found is not None and found.status == "ready",
            "held_back": refit_evidence.held_back(found, **tuple_of)}


def _provenance(
    ctx: Context, session: Any, inputs: tuple[str, ...], seen: set[str]
) -> list[dict[str, Any]]:
    """Input artifacts, each with its own inputs, as far as the store has their manifests."""
    from registry.errors import NotFoundError
    from registry.ops.fetch import load_manifest
    from registry.sql import records

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
