"""Ranking by current evidence (issue 23 item 6): resolve, pull and serve rank by the latest
proof on the fingerprint the node has now, or the nearest one, said as such, never by the
best number ever recorded; an artifact proven only on an old fingerprint is unproven for
this one. Every case on the file store and S3, each with SQLite and PostgreSQL; the node's
fingerprint comes from the nvidia-smi stand-in where the CLI reads it (`--gpu auto`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from registry.context import Context
from registry.gpus import lookup_gpu
from registry.ops.resolve import Request, resolve
from registry.sql import smoke_records
from registry.sql.evidence import Proof, nearest
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.deploy import artifacts
from tests.helpers import FAKES, fake_gpu

H100 = "H100-SXM5-80GB"
OLD, SAME_BRANCH, NEW = "570.124.06", "575.51.03", "575.57.08"


def proven(ctx: Context, digest: str, tokens_per_s: float, driver: str, *,
           gpu: str = H100, passed: bool = True) -> None:
    """A smoke report of *digest* measured on *gpu* with *driver*."""
    with ctx.registry.session() as session:
        smoke_records.add_smoke_report(session, digest, passed,
                                       {"best_output_tokens_per_s": tokens_per_s}, gpu=gpu,
                                       toolchain={"gpu": gpu, "driver": driver, "trtllm": "1.2.1"})


def cli(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = run_cli([ENGINECTL, *args, "--json"], env=env, timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_the_proof_on_this_fingerprint_beats_a_higher_number_on_an_old_driver(
    ctx: Context, tmp_path: Path
) -> None:
    """Two driver groups of one Ray pool built one target each: the node prefers the engine
    proven on its own driver; the other is unproven here, ranked by its nearest proof."""
    old_fast = artifacts.engine(ctx, tmp_path / "old", seed=1)
    new_slow = artifacts.engine(ctx, tmp_path / "new", seed=2)
    proven(ctx, old_fast, 9000.0, OLD)
    proven(ctx, new_slow, 500.0, NEW)

    node = Request(model="m", gpu=lookup_gpu("h100"), toolchain={"driver": NEW})
    ranked = resolve(ctx, node, explain=True)
    assert [(c.digest, c.proven, c.tokens_per_s) for c in ranked.candidates] == [
        (new_slow, True, 500.0), (old_fast, False, 9000.0)]
    note = ranked.candidates[1].unproven_note(H100)
    assert note is not None
    assert note.startswith(f"unproven on this fingerprint of {H100} (nearest proof, same SKU, ")
    assert note.endswith(f": driver {OLD} → {NEW})")
    described = ranked.as_dict()
    assert described["fingerprint"] == {"gpu": H100, "driver": NEW}
    used = [c["evidence_used"] for c in described["candidates"]]
    assert [(u["match"], u["nearest_by"], u["tokens_per_s"]) for u in used] == [
        ("this fingerprint", None, 500.0), ("nearest", "sku", 9000.0)]
    assert used[1]["toolchain"]["driver"] == OLD
    assert used[1]["differs"] == [f"driver {OLD} → {NEW}"]

    # on the old driver the order turns: each node prefers what was proven on its own
    on_old = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100"), toolchain={"driver": OLD}))
    assert [(c.digest, c.proven) for c in on_old.candidates] == [(old_fast, True),
                                                                 (new_slow, False)]
    # a node that names only its SKU knows no driver: every proof on the SKU counts
    by_name = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100")))
    assert [(c.digest, c.proven) for c in by_name.candidates] == [(old_fast, True),
                                                                  (new_slow, True)]


def test_the_latest_proof_counts_not_the_best_ever_and_the_branch_is_nearer(
    ctx: Context, tmp_path: Path
) -> None:
    once_fast = artifacts.engine(ctx, tmp_path / "a", seed=1)
    steady = artifacts.engine(ctx, tmp_path / "b", seed=2)
    branch = artifacts.engine(ctx, tmp_path / "c", seed=3)
    proven(ctx, once_fast, 9000.0, NEW)
    proven(ctx, once_fast, 300.0, NEW)  # re-proved slower on the same fingerprint
    proven(ctx, once_fast, 99999.0, NEW, passed=False)  # a failed run proves nothing
    proven(ctx, steady, 500.0, NEW)
    proven(ctx, branch, 8000.0, OLD)
    proven(ctx, branch, 700.0, SAME_BRANCH)  # the nearer proof wins over the older one
    ranked = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100"),
                                  toolchain={"driver": NEW}))
    assert [(c.digest, c.tokens_per_s) for c in ranked.candidates] == [
        (steady, 500.0), (once_fast, 300.0), (branch, 700.0)]
    last = ranked.candidates[2]
    assert last.used is not None
    assert last.used.match == "driver branch"
    assert "same SKU and driver branch, " in (last.unproven_note(H100) or "")


def test_nearest_is_a_pure_rule() -> None:
    from datetime import UTC, datetime, timedelta

    at = datetime(2026, 12, 1, tzinfo=UTC)
    proofs = [Proof("d", H100, at, 1.0, {"driver": OLD, "vllm": "0.31.0"}),
              Proof("d", H100, at + timedelta(1), 2.0, {"driver": SAME_BRANCH, "vllm": "0.32.0"}),
              Proof("d", H100, at + timedelta(2), 3.0, {"driver": OLD, "vllm": "0.32.0"})]
    assert nearest(proofs, "vllm", {"driver": NEW, "vllm": "0.32.0"}).proof == proofs[1]
    assert nearest(proofs, "vllm", {"driver": OLD, "vllm": "0.32.0"}).match == "fingerprint"
    assert nearest(proofs, "vllm", {"driver": OLD, "vllm": "0.32.0"}).proof == proofs[2]
    # the engine's runtime fields do not count for a vLLM entry, the vLLM version does
    assert nearest(proofs, "vllm", {"driver": OLD, "trtllm": "9"}).proof == proofs[2]
    assert nearest(proofs[:1], "vllm", {"driver": OLD, "vllm": "0.32.0"}).differs == (
        "vllm 0.31.0 → 0.32.0",)
    assert nearest([], "vllm", {"driver": OLD}).match == "none"


def test_resolve_and_pull_on_the_node_show_the_evidence_they_used(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    old_fast = artifacts.engine(ctx, tmp_path / "old", seed=1)
    new_slow = artifacts.engine(ctx, tmp_path / "new", seed=2)
    proven(ctx, old_fast, 9000.0, OLD)
    proven(ctx, new_slow, 500.0, NEW)
    env = {**deploy_env, **fake_gpu(tmp_path / "gpu", driver=NEW),
           "PATH": f"{FAKES / 'bin'}{os.pathsep}{deploy_env['PATH']}"}

    ranked = cli(env, "resolve", "--model", "m", "--gpu", "auto", "--explain")
    assert ranked["fingerprint"]["driver"] == NEW
    first, second = ranked["candidates"]
    assert (first["digest"], first["proven"]) == (new_slow, True)
    assert first["evidence_used"]["match"] == "this fingerprint"
    assert (second["digest"], second["proven"]) == (old_fast, False)
    assert second["evidence_used"]["match"] == "nearest"
    assert second["note"].startswith(f"unproven on this fingerprint of {H100}")

    pulled = cli(env, "pull", "--model", "m", "--gpu", "auto", "-o", str(tmp_path / "out"),
                 "--executable", sys.executable)
    assert pulled["digest"] == new_slow
    assert pulled["evidence"]["match"] == "this fingerprint"
    assert pulled["evidence"]["toolchain"]["driver"] == NEW
    assert pulled["evidence"]["fingerprint"]["driver"] == NEW

    # after a driver bump nothing is proven on the node's fingerprint: the nearest, said so
    env.update(fake_gpu(tmp_path / "gpu", driver="580.65.06"))
    bumped = cli(env, "pull", "--model", "m", "--gpu", "auto", "-o", str(tmp_path / "out2"),
                 "--executable", sys.executable)
    assert bumped["evidence"]["match"] == "nearest"
    assert bumped["evidence"]["nearest_by"] == "sku"
    assert any("unproven on this fingerprint" in line for line in bumped["notes"])
