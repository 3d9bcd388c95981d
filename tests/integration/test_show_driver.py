"""`show` reads on the database driver (`registry.sql.showing`); it must answer exactly
what the ORM's reads answered (tests/integration/show_reference.py), text and --json, on
SQLite and PostgreSQL, for an artifact with aliases, a rollback's pin, smoke reports,
evidence, a warm cache, inputs, a stage run and refit evidence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.listings import show_lines
from registry.context import Context
from registry.ops.aliases import rollback, tag
from registry.ops.inventory import show
from registry.ops.publish import publish
from registry.sql import leases, smoke_records
from tests.integration.show_reference import show_through_the_orm

H100 = "H100-SXM5-80GB"


def _folder(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"seed": seed}))
    (root / "rank0.engine").write_bytes(os.urandom(2_000) + bytes([seed]))
    return root


@pytest.mark.parametrize("store", ["file"], indirect=True)
def test_show_answers_as_the_orm_did(ctx: Context, tmp_path: Path) -> None:
    engine = {"model": "m", "runtime": "trtllm", "gpu": H100, "sm": 90, "quant": "fp8",
              "tp": 1, "pp": 1}
    source = publish(ctx, _folder(tmp_path / "ckpt", 0), kind="trtllm-checkpoint",
                     labels={"model": "m", "quant": "fp8"}, status="ready").digest
    key = "k1:" + "cd" * 32
    stripped = publish(
        ctx, _folder(tmp_path / "stripped", 1), kind="trtllm-engine",
        labels=engine | {"strip_plan": True, "refit_source": source}, status="ready",
        key=key, toolchain={"trtllm": "1.2.1", "driver": "570.86"}, inputs=(source,),
        recipe_digest="sha256:" + "ef" * 32).digest
    older = publish(ctx, _folder(tmp_path / "older", 2), kind="trtllm-engine",
                    labels=engine, status="ready").digest
    refuted = publish(ctx, _folder(tmp_path / "refuted", 3), kind="refit-equivalence",
                      labels={"model": "m", "quant": "fp8", "gpu": H100}, status="quarantined",
                      status_reason="outputs differ", toolchain={"trtllm": "1.2.1"}).digest
    publish(ctx, _folder(tmp_path / "warm", 4), kind="warm-cache",
            labels={"model": "m", "gpu": H100, "artifact": stripped}, status="ready")
    with ctx.registry.session() as session:
        assert leases.try_acquire_lease(session, key, owner="o", host="h", pid=7, ttl_s=60)
        assert leases.release_lease(session, key, owner="o", status="succeeded",
                                    artifact_digest=stripped, log_location="logs/x.log")
        for passed, gpu, rate in ((True, H100, 120.5), (False, "CPU", None), (True, "CPU", 3.5)):
            smoke_records.add_smoke_report(
                session, stripped, passed, {"output_tokens_per_s": rate, "note": None},
                gpu=gpu, toolchain={"driver": "570.86"} if gpu == H100 else None, key=key)
    tag(ctx, older, "m/h100/prod")
    tag(ctx, stripped, "m/h100/prod", note="newer")
    rollback(ctx, "m/h100/prod", note="TTFT regression")  # pins prod on older
    tag(ctx, stripped, "m/canary")

    for ref in (stripped, older, "m/h100/prod", source, refuted):
        expected = show_through_the_orm(ctx, ref)
        found = show(ctx, ref)
        assert found == expected, ref
        assert json.dumps(found, default=str) == json.dumps(expected, default=str), ref
        assert show_lines(found) == show_lines(expected), ref
    shown = show(ctx, stripped)
    assert shown["refit_equivalence"]["held_back"]  # refuted: the table is not all Nones
    assert [r["gpu"] for r in shown["smoke_reports"]] == [H100, "CPU", "CPU"]
    assert shown["stage_run"]["log"] == "logs/x.log"
    assert shown["warm_caches"]
    assert shown["provenance"][0]["digest"] == source
    assert show(ctx, "m/h100/prod")["pins"][0]["to"] == older
