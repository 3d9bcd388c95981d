"""reindex: the bucket alone brings back the registry (statuses, smoke evidence, aliases and their
history), and a bad manifest or record is skipped and reported, on every store and database."""

from __future__ import annotations

from pathlib import Path

from registry.config import RegistryConfig
from registry.context import Context
from registry.identity.digest import Digest
from registry.ops.adopt import import_artifact
from registry.ops.aliases import tag, untag
from registry.ops.reindex import reindex
from registry.sql import alias_records, records, smoke_records
from tests.integration.engines import engine_spec, make_engine, overwrite


def _fresh(ctx: Context, tmp_path: Path, name: str = "fresh") -> Context:
    """The same store with an empty SQLite registry and cache of its own."""
    return Context(RegistryConfig(
        home=tmp_path, store_url=ctx.config.store_url,
        s3_endpoint_url=ctx.config.s3_endpoint_url,
        registry_url=f"sqlite:///{tmp_path / f'{name}.db'}", cache_dir=tmp_path / f"{name}-c",
    ))


def _state(ctx: Context) -> dict[str, object]:
    """Everything reindex must bring back, in comparable form."""
    from sqlalchemy import select

    from registry.sql.models import Artifact

    with ctx.registry.session(readonly=True) as session:
        artifacts = records.list_artifacts(session)
        aliases = {name for r in artifacts for name in alias_records.aliases_for(session, r.digest)}
        names = aliases | {"m/h100/gone"}
        # the column itself: reindex must restore it, and no registry function returns it
        best = session.execute(select(Artifact.digest, Artifact.best_tokens_per_s)).all()
        return {
            "artifacts": {r.digest: (r.status, r.status_reason, r.recipe_digest)
                          for r in artifacts},
            "best": dict(best),
            "smoke": {r.digest: smoke_records.smoke_reports(session, r.digest) for r in artifacts},
            "aliases": {name: alias_records.get_alias(session, name) for name in sorted(names)},
            "history": {name: alias_records.alias_history(session, name) for name in sorted(names)},
        }


def test_reindex_restores_statuses_evidence_and_aliases(
    ctx: Context, tmp_path: Path, registry_url: str
) -> None:
    """The bucket is the whole truth: from the store alone, reindex brings back every status
    (ready, quarantined, superseded, deleted, built), every smoke report with its GPU,
    toolchain and key, best_tokens_per_s, and every alias with its history."""
    from registry.ops import history

    ready = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    smoked = import_artifact(ctx, make_engine(tmp_path / "b", seed=2),
                             engine_spec(status="built"))
    bad = import_artifact(ctx, make_engine(tmp_path / "c", seed=3), engine_spec(status="built"))
    old = import_artifact(ctx, make_engine(tmp_path / "d", seed=4), engine_spec())
    plain = import_artifact(ctx, make_engine(tmp_path / "e", seed=5),
                            engine_spec(status="built"))
    with ctx.registry.session() as session:
        history.add_smoke_report_and_record(ctx.store, session, smoked.digest, False,
                                            {"failure": "chat: timeout"}, gpu="H100-SXM5-80GB")
        history.add_smoke_report_and_record(ctx.store, session, smoked.digest, True,
                                            {"best_output_tokens_per_s": 812.5},
                                            gpu="H100-SXM5-80GB",
                                            toolchain={"trtllm": "1.2.1"}, key="k1:" + "5" * 64)
        history.set_status_and_record(ctx.store, session, smoked.digest, "ready")
        history.add_smoke_report_and_record(ctx.store, session, bad.digest, False, {"failure": "x"})
        history.set_status_and_record(ctx.store, session, bad.digest, "quarantined",
                                      "smoke failed: x")
        history.set_status_and_record(ctx.store, session, old.digest, "superseded",
                                      "by a faster one")
    tag(ctx, ready.digest, "m/h100/prod", note="first")
    tag(ctx, smoked.digest, "m/h100/prod", note="faster")
    tag(ctx, old.digest, "m/h100/gone", allow_unready=True)
    untag(ctx, "m/h100/gone")
    with ctx.registry.session() as session:
        history.set_alias_and_record(ctx.store, session, "m/h100/canary", ready.digest, "promoted",
                                     details={"old": 500.0, "new": 812.5})
        history.set_status_and_record(ctx.store, session, plain.digest, "deleted", "gc")
    before = _state(ctx)

    fresh = _fresh(ctx, tmp_path)
    restored = reindex(fresh)
    after = _state(fresh)
    fresh.close()
    assert restored.problems == []
    assert (restored.artifacts, restored.aliases) == (5, 2)
    assert after == before
    assert before["artifacts"][smoked.digest][0] == "ready"  # type: ignore[index]
    assert before["best"][smoked.digest] == 812.5  # type: ignore[index]
    del registry_url


def test_reindex_skips_a_bad_manifest_or_record_and_reports_each(
    ctx: Context, tmp_path: Path
) -> None:
    from registry.identity.layout import manifest_name

    good = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    broken = import_artifact(ctx, make_engine(tmp_path / "b", seed=2), engine_spec())
    overwrite(ctx, manifest_name(Digest.parse(broken.digest)), b'{"edited": true}')
    token = "0" * 32
    junk = f"records/sha256/{good.digest[7:]}/status/20261201T000000000000Z-{token}.json"
    ctx.store.put_object(junk, b"not json")
    fresh = _fresh(ctx, tmp_path)
    restored = reindex(fresh)
    with fresh.registry.session(readonly=True) as session:
        statuses = {r.digest: r.status for r in records.list_artifacts(session)}
    fresh.close()
    assert statuses == {good.digest: "ready"}
    assert len(restored.problems) == 3, restored.problems  # the manifest, the junk, an orphan
    assert any(broken.digest in p and "manifest" in p for p in restored.problems)
    assert any(junk in p for p in restored.problems)
