"""resolve's queries against a straightforward reference, on a generated registry.

`registry.ops.resolve.resolve` reads only what it ranks (the ready artifacts of the model,
engines for the node's SKU alone, the passing reports on that SKU of exactly those rows), in
statements shaped for speed at a million rows. The reference here reads every artifact of
the model and every smoke report and evidence row through the ORM, and filters them in
Python, the way the module doc says. Both go through the same pure `rank` and `nearest`, so
what is compared is which rows and proofs each reads: the rankings, the rejections with
their reasons, and the evidence each carries must be the same for every sampled request, on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.config import RegistryConfig
from registry.context import Context
from registry.gpus import CATALOG
from registry.ops.resolve import (
    KIND_ORDER,
    UNPROVEN_RANK,
    Candidate,
    Ranked,
    Request,
    rank,
    resolve,
)
from registry.sql.evidence import FINGERPRINT_FIELDS, Proof, nearest
from registry.sql.models import Artifact, ArtifactEvidence, SmokeReportRow
from registry.sql.records import ArtifactRecord, add_artifact
from registry.sql.smoke_records import add_smoke_report

MODELS = ("llama-8b", "qwen-7b", "mistral-7b")
GPUS = tuple(gpu for gpu in CATALOG if not gpu.is_cpu)[:5]  # few SKUs: more proofs on each
KINDS = ("trtllm-engine",) * 4 + ("trtllm-checkpoint", "vllm", "hf-checkpoint")
STATUSES = ("ready",) * 6 + ("built", "superseded", "quarantined", "deleted")
DRIVERS = ("570.86.10", "570.124.06", "575.57.08")
TRTLLM = ("0.16.0", "0.17.0")


def _toolchain(rng: random.Random) -> dict[str, str]:
    values = {"driver": rng.choice(DRIVERS), "cuda": rng.choice(("12.6", "12.8")),
              "tensorrt": rng.choice(("10.7.0", "10.8.0")), "trtllm": rng.choice(TRTLLM),
              "vllm": rng.choice(("0.8.5", "0.9.0"))}
    return {name: value for name, value in values.items() if rng.random() < 0.8}


def _seed(session: Session, rng: random.Random) -> None:
    """~360 artifacts over three models, every kind and status, and 1–4 smoke reports on a
    third of them (passed or not, each with a fingerprint; an engine's on the SKU it was
    built for, the others' on any SKU or the CPU), through the registry's own writers."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(360):
        kind = rng.choice(KINDS)
        gpu = rng.choice(GPUS) if kind == "trtllm-engine" else None
        created = start + timedelta(minutes=n * 7 + rng.randrange(5))  # distinct: no ties
        add_artifact(session, ArtifactRecord(
            digest=f"sha256:{n:064x}", kind=kind, model=rng.choice(MODELS), size=1,  # type: ignore[arg-type]
            file_count=0, status=rng.choice(STATUSES), gpu=gpu.sku if gpu else None,  # type: ignore[arg-type]
            sm=gpu.sm if gpu else None, quant=rng.choice(("bf16", "fp8", "int4_awq", "nvfp4")),
            kv_cache_dtype=rng.choice(("auto", "fp8")), tp=rng.choice((1, 2, 4, 8)),
            pp=rng.choice((1, 1, 2)), max_batch_size=rng.choice((8, 64, 256)),
            max_seq_len=rng.choice((2048, 8192, 32768)),
            toolchain={"trtllm": rng.choice(TRTLLM), "tensorrt": "10.8.0", "cuda": "12.8"},
            created_at=created, updated_at=created))
        if rng.random() < 0.35:
            for m in range(rng.randint(1, 4)):
                where = rng.choice([gpu.sku for gpu in GPUS] + ["CPU"])
                add_smoke_report(
                    session, f"sha256:{n:064x}", rng.random() < 0.85,
                    {"best_output_tokens_per_s": round(rng.uniform(100, 5000), 1)},
                    gpu=gpu.sku if gpu is not None else where,
                    toolchain=_toolchain(rng), created_at=created + timedelta(hours=m + 1))


def _requests(rng: random.Random, count: int) -> Iterator[tuple[Request, bool]]:
    for _ in range(count):
        node = {name: value for name, value in _toolchain(rng).items() if rng.random() < 0.7}
        yield Request(
            model=rng.choice(MODELS), gpu=rng.choice(GPUS),
            gpu_count=rng.choice((None, 1, 4, 8)), min_seq_len=rng.choice((None, 4096)),
            min_batch=rng.choice((None, None, 64)),
            prefer=rng.choice(((), ("vllm",), ("checkpoint", "engine"))),
            toolchain=node, allow_unproven=rng.random() < 0.4,
        ), rng.random() < 0.4


def _reference(session: Session, request: Request, explain: bool) -> Ranked:
    """What resolve should answer, from every row of the model read plainly."""
    sku = request.gpu.sku
    artifacts = session.scalars(select(Artifact).where(Artifact.model == request.model)).all()
    reports = session.scalars(select(SmokeReportRow).order_by(SmokeReportRow.created_at,
                                                              SmokeReportRow.id)).all()
    evidence = session.scalars(select(ArtifactEvidence).order_by(ArtifactEvidence.gpu)).all()
    found = []
    for row in artifacts:
        if row.kind not in KIND_ORDER or row.status == "deleted":
            continue
        if not explain and (row.status != "ready"
                            or (row.kind == "trtllm-engine" and row.gpu != sku)):
            continue
        proofs = [Proof(row.digest, sku, report.created_at,
                        (report.report or {}).get("best_output_tokens_per_s"),
                        {name: (report.toolchain or {}).get(name)
                         for name in FINGERPRINT_FIELDS})
                  for report in reports
                  if report.artifact_id == row.id and report.passed and report.gpu == sku]
        used = nearest(proofs, row.kind, request.toolchain)
        found.append(Candidate(
            row.digest, row.kind, row.model, row.status, row.created_at, row.gpu, row.quant,
            row.kv_cache_dtype, row.tp, row.max_batch_size, row.max_seq_len, pp=row.pp or 1,
            toolchain={"trtllm": row.toolchain.get("trtllm"),
                       "tensorrt": row.toolchain.get("tensorrt")},
            tokens_per_s=used.proof.tokens_per_s if used.proof else None,
            proven=used.match == "fingerprint", used=used, row_id=row.id))
    # where each passed: always with explain, else only what the words need (resolve's doc)
    wanted = explain or request.allow_unproven or all(
        c.match_rank == UNPROVEN_RANK for c in found)
    if wanted:
        found = [replace(c, evidence=tuple(e.gpu for e in evidence if e.artifact_id == c.row_id))
                 if explain or c.match_rank == UNPROVEN_RANK else c for c in found]
    return rank(found, request)


def _comparable(ranked: Ranked) -> dict[str, Any]:
    """The answer, the rejections in digest order (resolve's row order is the database's)."""
    answer = ranked.as_dict()
    answer["rejected"] = sorted(answer["rejected"], key=lambda entry: entry["digest"])
    return answer


def test_resolve_answers_as_the_plain_reference_on_sampled_requests(
    registry_url: str, tmp_path: Path
) -> None:
    rng = random.Random(42)  # reproducible data and requests, not secrets
    config = RegistryConfig(home=tmp_path, store_url=(tmp_path / "store").as_uri(),
                            s3_endpoint_url=None, registry_url=registry_url,
                            cache_dir=tmp_path / "cache")
    ctx = Context(config)
    try:
        with ctx.registry.session() as session:
            _seed(session, rng)
        compared = proven = 0
        for request, explain in _requests(rng, 150):
            answer = resolve(ctx, request, explain=explain)
            with ctx.registry.session(readonly=True) as session:
                expected = _reference(session, request, explain)
            assert _comparable(answer) == _comparable(expected), (request, explain)
            compared += 1
            proven += any(c.proven for c in answer.candidates)
        assert compared == 150
        assert proven > 10  # the sample ranks proven candidates, not only empty answers
    finally:
        ctx.close()
