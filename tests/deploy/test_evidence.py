"""Evidence per GPU: smoke reports say where they ran, and resolve, compare, ls and show use
only the node's own SKU's evidence. Every case on the file store and S3, each with SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.serving.compare import compare, render_table
from registry.context import Context
from registry.errors import UnknownModelError
from registry.gpus import lookup_gpu
from registry.ops.resolve import Request, resolve
from registry.sql import smoke_records
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.deploy import artifacts
from tests.integration.show_reference import evidence_for

H100, H200 = "H100-SXM5-80GB", "H200-SXM-141GB"


def cli(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


def test_reports_record_where_they_ran_and_keep_the_best_per_gpu(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source)
    for gpu, passed, tokens in ((H100, True, 500.0), ("CPU", True, 900.0),
                                (H100, False, 9000.0), (H100, True, 700.0), (H100, True, 300.0)):
        artifacts.smoked(ctx, entry, gpu, tokens, passed)
    with ctx.registry.session() as session:  # an old-style report: where is unknown
        smoke_records.add_smoke_report(session, entry, True, {"best_output_tokens_per_s": 5000.0})
    with ctx.registry.session(readonly=True) as session:
        reports = smoke_records.smoke_reports(session, entry)
        evidence = evidence_for(session, [entry, source])
    assert [(r.gpu, r.passed) for r in reports] == [
        (H100, True), ("CPU", True), (H100, False), (H100, True), (H100, True), (None, True)]
    assert reports[0].toolchain == {"gpu": H100, "vllm": "0.32.0"}
    assert [(e.gpu, e.best_tokens_per_s) for e in evidence[entry]] == [("CPU", 900.0),
                                                                         (H100, 700.0)]
    assert evidence[source] == []


def test_resolve_ranks_by_evidence_from_the_nodes_gpu_only(ctx: Context, tmp_path: Path) -> None:
    """The CPU's 5000 tok/s never rank anything on an H100; proven there beats unproven."""
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    fast_on_cpu = artifacts.vllm_entry(ctx, tmp_path / "cpu-entry", source)
    proven_h100 = artifacts.vllm_entry(ctx, tmp_path / "h100-entry", source,
                                       extra={"note.txt": b"other"})
    engine_h200 = artifacts.engine(ctx, tmp_path / "h200", gpu=H200)
    never = artifacts.vllm_entry(ctx, tmp_path / "never", source, extra={"n": b"1"})
    artifacts.smoked(ctx, fast_on_cpu, "CPU", 5000.0)
    artifacts.smoked(ctx, proven_h100, H100, 100.0)
    artifacts.smoked(ctx, engine_h200, H200, 3000.0)

    # only what passed on the node's SKU is a candidate; the others say where they passed
    only = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100")))
    assert [(c.digest, c.proven, c.tokens_per_s) for c in only.candidates] == [
        (proven_h100, True, 100.0)]
    assert {c.digest: reason for c, reason in only.rejected} == {  # (other GPUs' engines
        fast_on_cpu: f"unproven on {H100} (no passing smoke there)",  # are not even read)
        never: f"unproven on {H100} (no passing smoke there)"}  # where else: not read
    explained = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100")), explain=True)
    assert {c.digest: reason for c, reason in explained.rejected} == {
        fast_on_cpu: f"unproven on {H100} (proven on CPU)",
        never: f"unproven on {H100} (no smoke evidence there)",
        engine_h200: f"GPU mismatch: engine built for {H200}, node has {H100}"}

    allowed = Request(model="m", gpu=lookup_gpu("h100"), allow_unproven=True)
    on_h100 = resolve(ctx, allowed, explain=True)
    assert [(c.digest, c.proven, c.tokens_per_s) for c in on_h100.candidates] == [
        (proven_h100, True, 100.0), (never, False, None), (fast_on_cpu, False, None)]
    notes = {c.digest: c.unproven_note(H100) for c in on_h100.candidates}
    assert notes[fast_on_cpu] == f"unproven on {H100} (proven on CPU)"
    assert notes[never] == f"unproven on {H100} (no smoke evidence there)"
    assert notes[proven_h100] is None
    reasons = "\n".join(on_h100.reasons())
    assert f"GPU mismatch: engine built for {H200}, node has {H100}" in reasons
    assert f"unproven on {H100} (proven on CPU)" in reasons

    on_h200 = resolve(ctx, Request(model="m", gpu=lookup_gpu("h200")))
    assert [c.digest for c in on_h200.candidates][:1] == [engine_h200]
    assert on_h200.candidates[0].tokens_per_s == 3000.0
    on_cpu = resolve(ctx, Request(model="m", gpu=lookup_gpu("cpu")))
    assert next((c.digest, c.tokens_per_s) for c in on_cpu.candidates) == (fast_on_cpu, 5000.0)
    as_dict = on_h100.as_dict()
    assert as_dict["gpu"] == H100
    assert as_dict["candidates"][2]["note"] == f"unproven on {H100} (proven on CPU)"


def test_resolve_of_an_unknown_model_says_so(ctx: Context, tmp_path: Path) -> None:
    artifacts.checkpoint(ctx, tmp_path / "ckpt", model="tiny-llama")
    with pytest.raises(UnknownModelError, match="no artifact of model 'tiny-lama' in the "
                       "registry; did you mean 'tiny-llama'"):
        resolve(ctx, Request(model="tiny-lama", gpu=lookup_gpu("cpu")))
    # a known model with nothing ready is an empty ranking, not an unknown model
    assert resolve(ctx, Request(model="tiny-llama", gpu=lookup_gpu("cpu"))).candidates == []


def test_cli_resolve_compare_ls_and_show_say_where_evidence_comes_from(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source)
    engine = artifacts.engine(ctx, tmp_path / "engine")
    with ctx.registry.session() as session:
        for digest, gpu, tokens in ((entry, "CPU", 900.0), (engine, H100, 2000.0)):
            smoke_records.add_smoke_report(session, digest, True, {
                "best_output_tokens_per_s": tokens, "ready_s": 1.0,
                "load": [{"concurrency": 1, "output_tokens_per_s": tokens}]},
                gpu=gpu, toolchain={"driver": "570.124.06", "vllm": "0.32.0"})

    proven_only = cli(deploy_env, "resolve", "--model", "m", "--gpu", "h100", "--explain")
    assert proven_only.stdout.splitlines()[0].startswith(f"1. {engine}")
    assert not proven_only.stdout.splitlines()[1].startswith("2. ")
    assert (f"rejected {entry[:19]}… vllm: unproven on {H100} (proven on CPU)"
            in proven_only.stdout)
    explained = cli(deploy_env, "resolve", "--model", "m", "--gpu", "h100", "--explain",
                    "--allow-unproven").stdout
    first, second = explained.splitlines()[:2]
    assert first.startswith(f"1. {engine}")
    assert "2000 tok/s" in first
    assert second.startswith(f"2. {entry}")
    assert f"unproven on {H100}" in second
    assert "unmeasured" in second  # the CPU's 900 tok/s are not the H100's
    assert f"unproven {entry[:19]}… vllm: unproven on {H100} (proven on CPU)" in explained

    table = cli(deploy_env, "compare", "--model", "m", "--gpu", "h100").stdout
    assert table.splitlines()[0] == f"m on {H100}: smoke evidence measured on {H100} only"
    rows = {line[:12]: line for line in table.splitlines() if line[:12] in (entry[7:19],
                                                                             engine[7:19])}
    assert "2000.0" in rows[engine[7:19]]
    assert "900.0" not in table  # measured on the CPU
    assert compare(ctx, "m", gpu="cpu").rows[-1].best_output_tokens_per_s == 900.0
    assert render_table(compare(ctx, "m")).splitlines()[0] == "m"

    listed = json.loads(cli(deploy_env, "ls", "--json", "--kind", "vllm").stdout)
    assert [e["gpu"] for e in listed[0]["evidence"]] == ["CPU"]
    assert "PROVEN ON" in cli(deploy_env, "ls").stdout
    shown = cli(deploy_env, "show", entry).stdout
    assert "smoke     passed at" in shown
    assert "on CPU (driver 570.124.06, vllm 0.32.0)" in shown
    assert json.loads(cli(deploy_env, "show", entry, "--json").stdout)[
        "smoke_reports"][0]["gpu"] == "CPU"

    unknown = cli(deploy_env, "resolve", "--model", "nope", "--gpu", "cpu", code=6)
    assert unknown.stderr.startswith("enginectl: error: no artifact of model 'nope'")
