"""`enginectl compare`: a real registry (file store + SQLite) seeded with ready artifacts and
smoke reports, the table, the JSON, the CLI, and the HTML page loaded in a real headless
chromium (scripts/install-browser; skips without it, fails under CI=true)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.serving.compare import compare, render_table
from pipeline.serving.compare_html import render_html, write_html
from pipeline.serving.loadgen import cost_per_million_tokens
from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import RecordNotFoundError, UsageError
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.publish import publish
from registry.sql import leases, records, smoke_records
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.browser import browse
from tests.integration.engines import make_engine

ROOT = Path(__file__).resolve().parents[2]
KEY = "k1:" + "ab" * 32


def smoke_report(levels: list[tuple[int, float, float, float]], *, ready_s: float,
                 price_per_hour: float | None, passed: bool = True) -> dict[str, Any]:
    """A report shaped like pipeline.serving.smoke.SmokeReport.as_dict()."""
    best = max(tps for _, tps, _, _ in levels)
    return {
        "passed": passed, "failure": None if passed else "generate: empty completion",
        "ready_s": ready_s, "best_output_tokens_per_s": best,
        "cost_per_million_tokens": cost_per_million_tokens(price_per_hour, best),
        "price_per_hour": price_per_hour, "log_path": "smoke.log",
        "argv": ["server", "--port", "1"], "checks": [],
        "load": [{"concurrency": c, "requests": 4 * c, "errors": 0, "output_tokens": 64 * c,
                  "wall_s": 1.0, "output_tokens_per_s": tps, "ttft_p50_s": p50,
                  "ttft_p95_s": p95, "first_error": None} for c, tps, p50, p95 in levels],
    }


def checkpoint_dir(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (root / "model.safetensors").write_bytes(os.urandom(20_000) + bytes([seed]))
    return root


@dataclass
class Seeded:
    home: Path
    ctx: Context
    h100: str  # engine with a stage run, three reports (latest passing is the middle one)
    a100: str  # engine imported, for another GPU
    checkpoint: str
    vllm: str
    quarantined: str


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    base = tmp_path_factory.mktemp("compare")
    home = base / "home"
    ctx = Context(RegistryConfig.from_env({"ENGINECTL_HOME": str(home)}))
    engine_labels = {"model": "m", "runtime": "trtllm", "gpu": "H100-SXM5-80GB", "sm": 90,
                     "quant": "fp8", "tp": 2, "pp": 1}
    h100 = publish(ctx, make_engine(base / "h100", seed=1), kind="trtllm-engine",
                   labels=engine_labels, status="ready", key=KEY).digest
    a100 = import_artifact(ctx, make_engine(base / "a100", tp=1, seed=2), ImportSpec(
        kind="trtllm-engine", model="m", gpu="a100", quant="bf16", status="ready")).digest
    checkpoint = import_artifact(ctx, checkpoint_dir(base / "ckpt", 3), ImportSpec(
        kind="trtllm-checkpoint", model="m", quant="fp8", status="ready")).digest
    vllm = import_artifact(ctx, checkpoint_dir(base / "vllm", 4), ImportSpec(
        kind="vllm", model="m", quant="bf16", status="ready")).digest
    quarantined = import_artifact(ctx, make_engine(base / "bad", seed=5), ImportSpec(
        kind="trtllm-engine", model="m", gpu="h100", quant="fp8", status="ready")).digest
    other_model = import_artifact(ctx, checkpoint_dir(base / "other", 6), ImportSpec(
        kind="vllm", model="other", status="ready")).digest
    import_artifact(ctx, checkpoint_dir(base / "unsmoked", 7), ImportSpec(
        kind="vllm", model="n", status="ready"))
    started = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    with ctx.registry.session() as session:
        assert leases.try_acquire_lease(session, KEY, owner="o", host="h", pid=1, ttl_s=3600,
                                        now=started)
        assert leases.release_lease(session, KEY, owner="o", status="succeeded",
                                    artifact_digest=h100,
                                    now=started + timedelta(seconds=754))
        add = smoke_records.add_smoke_report
        add(session, h100, True, smoke_report([(1, 100.0, 0.5, 0.9), (8, 500.0, 0.6, 1.0)],
                                              ready_s=99.0, price_per_hour=1.0))
    with ctx.registry.session() as session:  # a later transaction: a later created_at
        add(session, h100, True, smoke_report(
            [(1, 250.0, 0.05, 0.08), (4, 900.0, 0.07, 0.11), (16, 2000.0, 0.12, 0.2)],
            ready_s=42.5, price_per_hour=3.6))
    with ctx.registry.session() as session:
        add(session, h100, False, smoke_report([(1, 1.0, 9.0, 9.0)], ready_s=1.0,
                                               price_per_hour=3.6, passed=False))
        add(session, a100, True, smoke_report([(1, 150.0, 0.09, 0.15), (4, 600.0, 0.1, 0.2),
                                               (16, 900.0, 0.2, 0.4)],
                                              ready_s=60.0, price_per_hour=2.0))
        add(session, checkpoint, True, smoke_report([(1, 120.0, 0.1, 0.2), (4, 400.0, 0.2, 0.3)],
                                                    ready_s=30.0, price_per_hour=3.6))
        add(session, vllm, True, smoke_report([(1, 80.0, 0.2, 0.3), (4, 250.0, 0.3, 0.5),
                                               (16, 700.0, 0.4, 0.9)],
                                              ready_s=20.0, price_per_hour=None))
        add(session, quarantined, True, smoke_report([(1, 9999.0, 0.01, 0.01)],
                                                     ready_s=1.0, price_per_hour=1.0))
        add(session, other_model, True, smoke_report([(1, 1.0, 0.1, 0.1)], ready_s=1.0,
                                                     price_per_hour=1.0))
        records.set_status(session, quarantined, "quarantined", "smoke: wrong output")
    yield Seeded(home, ctx, h100, a100, checkpoint, vllm, quarantined)
    ctx.close()


def test_rows_order_and_numbers(seeded: Seeded) -> None:
    result = compare(seeded.ctx, "m")
    assert [row.digest for row in result.rows] == [
        seeded.h100, seeded.a100, seeded.checkpoint, seeded.vllm]
    assert result.concurrencies == [1, 4, 16]
    h100 = result.rows[0]
    assert h100.build_s == 754.0
    assert h100.ready_s == 42.5  # the latest passing report, not the newer failing one
    assert h100.best_output_tokens_per_s == 2000.0
    assert h100.cost_per_million_tokens == pytest.approx(0.5)  # $3.6/h at 2000 tok/s
    assert [(lv.concurrency, lv.output_tokens_per_s, lv.ttft_p50_s, lv.ttft_p95_s)
            for lv in h100.levels] == [(1, 250.0, 0.05, 0.08), (4, 900.0, 0.07, 0.11),
                                       (16, 2000.0, 0.12, 0.2)]
    assert all(row.build_s is None for row in result.rows[1:])  # imports have no stage run
    assert result.rows[3].cost_per_million_tokens is None  # no price, no cost
    assert result.rows[2].gpu is None
    assert h100.size == sum(
        p.stat().st_size for p in (seeded.home.parent / "h100").rglob("*") if p.is_file())


def test_gpu_filter_keeps_untied_artifacts(seeded: Seeded) -> None:
    result = compare(seeded.ctx, "m", gpu="NVIDIA H100 80GB HBM3")
    assert result.gpu == "H100-SXM5-80GB"
    assert [row.digest for row in result.rows] == [seeded.h100, seeded.checkpoint, seeded.vllm]
    assert [row.digest for row in compare(seeded.ctx, "m", gpu="a100").rows] == [
        seeded.a100, seeded.checkpoint, seeded.vllm]
    with pytest.raises(UsageError, match="unknown GPU 'h9000'"):
        compare(seeded.ctx, "m", gpu="h9000")
    with pytest.raises(RecordNotFoundError, match="enginectl ls --model nope"):
        compare(seeded.ctx, "nope")


def test_table(seeded: Seeded) -> None:
    text = render_table(compare(seeded.ctx, "m"))
    lines = text.splitlines()
    h100 = next(line for line in lines if line.startswith(seeded.h100[7:19]))
    assert re.search(r"H100-SXM5-80GB\s+fp8\s+2\s+.*12m34s\s+42\.5s\s+-\s+2000\.0\s+\$0\.50", h100)
    load = [line for line in lines if line.startswith(seeded.vllm[7:19])][-1]
    assert load.split()[1:] == ["80.0", "250.0", "700.0", "0.200/0.300", "0.300/0.500",
                                "0.400/0.900"]
    ckpt = [line for line in lines if line.startswith(seeded.checkpoint[7:19])][-1]
    assert ckpt.split()[1:4] == ["120.0", "400.0", "-"]  # not measured at 16
    assert seeded.quarantined[7:19] not in text


def test_ready_without_a_passing_report_has_a_row_but_no_line(seeded: Seeded) -> None:
    result = compare(seeded.ctx, "n")
    assert [(row.kind, row.smoked_at, row.levels) for row in result.rows] == [("vllm", None, ())]
    assert "no passing smoke report" in render_table(result)
    page = render_html(result)
    assert "<polyline" not in page
    assert "No passing smoke report to chart." in page


def cli(home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env["ENGINECTL_HOME"] = str(home)
    done = run_cli([ENGINECTL, *args], env=env, timeout=120)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done


def test_cli_json_html_and_errors(seeded: Seeded, tmp_path: Path) -> None:
    page = tmp_path / "compare.html"
    done = cli(seeded.home, "compare", "--model", "m", "--json", "--html", str(page))
    data = json.loads(done.stdout)
    assert data == json.loads(json.dumps(compare(seeded.ctx, "m").as_dict()))
    assert [row["kind"] for row in data["rows"]] == [
        "trtllm-engine", "trtllm-engine", "trtllm-checkpoint", "vllm"]
    assert data["rows"][0]["build_s"] == 754.0
    assert data["rows"][0]["load"][2] == {"concurrency": 16, "output_tokens_per_s": 2000.0,
                                          "ttft_p50_s": 0.12, "ttft_p95_s": 0.2, "errors": 0}
    assert f"wrote {page}" in done.stderr
    assert page.read_text() == render_html(compare(seeded.ctx, "m"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    table = cli(seeded.home, "compare", "--model", "m", "--gpu", "h100").stdout
    assert seeded.a100[7:19] not in table
    assert seeded.h100[7:19] in table
    missing = cli(seeded.home, "compare", "--model", "nope", code=6)
    assert missing.stderr.startswith("enginectl: error: no ready artifact of 'nope'")
    bad = cli(seeded.home, "compare", "--model", "m", "--gpu", "h9000", code=2)
    assert "unknown GPU 'h9000'" in bad.stderr


def test_html_escapes_text(seeded: Seeded) -> None:
    result = compare(seeded.ctx, "m")
    hostile = type(result)("<script>alert(1)</script>", None, result.rows)
    page = render_html(hostile)
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not re.search(r"(?:src|href)=|https?://(?!www\.w3\.org/2000/svg)", page)


# --- the page in a real browser ---------------------------------------------------------------


def test_page_renders_in_chromium(seeded: Seeded, chromium: str, tmp_path: Path) -> None:
    page = write_html(compare(seeded.ctx, "m"), tmp_path / "compare.html")
    dom = browse(chromium, tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    rows = re.findall(r'<tr class="artifact" data-digest="([^"]+)"', dom)
    assert rows == [seeded.h100, seeded.a100, seeded.checkpoint, seeded.vllm]
    lines = re.findall(r'<polyline class="series" data-digest="([^"]+)"', dom)
    assert lines == rows
    assert "<svg" in dom
    assert "2000.0" in dom
    assert "$0.50" in dom
    shot = tmp_path / "compare.png"
    browse(chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,900",
           "--hide-scrollbars", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 10_000
