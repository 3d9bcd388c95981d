"""How long `registry.ops.resolve.resolve` takes on a registry of 100,000 artifacts.

Seeds, with SQLAlchemy Core bulk inserts (lists of dicts) into the tables of
`registry.sql.models`, after `registry.sql.db.open_registry` has migrated an empty database:

- 100,000 `artifacts` rows (`--rows`): 200 models (`--models`; 2000 with a million rows
  keeps ~500 rows a model) × the catalog's GPUs × every artifact kind ×
  every status (70 % `ready`; engines 60 %, intermediates 20 %, TRT-LLM checkpoints and vLLM
  entries 10 % each), so one model has ~500 rows of which ~280 are ready and servable;
- `smoke_reports` for ~30 % of the ready servable artifacts (1–3 each, each measured on a
  GPU: an engine's own SKU, else one of the catalog's GPUs or the CPU), each artifact's
  `best_tokens_per_s` set to its best passing report, and `artifact_evidence` to the best
  passing report per (artifact, GPU), as `smoke_records.add_smoke_report` keeps them (resolve
  joins the evidence row of the node's SKU);

on SQLite (a file in a temp dir) and on PostgreSQL (a fresh schema, dropped afterwards, at
$ENGINECTL_BENCH_POSTGRES_URL, default postgresql+psycopg://postgres@127.0.0.1:5432/test).
Generating a million rows takes minutes, so the seeded rows are kept between runs (not with
--quick): a SQLite file under the bench cache dir, copied into the temp dir for each run,
and a PostgreSQL schema `bench_cache_…`, whose rows each run copies into its fresh schema
with one INSERT … SELECT a table (what a bulk import leaves: rows and indexes, no planner
statistics). Both are named after the row and model counts and `SEED_VERSION`, and
migrated to the schema head by each run (a new index is built there); `--reseed` makes them
again. Then it calls
`resolve(ctx, Request(model, gpu, gpu_count=8))` in this process for random models and
GPUs, CALLS times after WARMUP calls, fresh after seeding and again after ANALYZE, and
`resolve(..., explain=True)` (every status, what `enginectl resolve --explain` reads), on a
`Context(readonly=True)` as `enginectl resolve`, `pull` and `serve` open it: one driver
connection held for all calls (`Context.reader`). Prints, per case, p50/p90/p99/max of the
wall clock and, under it, of the call's own CPU time (what other processes' load does not
stretch; PostgreSQL's server time is in the wall clock only), the plan of resolve's
statement, where the time goes (cProfile), and a summary of both with the load.

Target: p99 < 5 ms on both databases, fresh and after ANALYZE; `explain=True` p99 < 10 ms.
Run: `.venv/bin/python bench/resolve_scale.py [--rows N] [--models N] [--calls N]
[--sqlite-only | --postgresql-only] [--reseed]` from the repository root (≈2 minutes at
100,000 rows; the first run at a million rows ≈15 minutes, later ones ≈3; `--quick`: 300
rows of 3 models, 60 calls, to check the script runs).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _support import (
    CACHE,
    add_quick,
    loadavg,
    log,
    machine,
    median,
    percentile,
    quick_mode,
    scratch,
)

from registry.config import RegistryConfig
from registry.context import Context
from registry.gpus import CATALOG
from registry.ops.resolve import Request, resolve
from registry.sql.db import open_registry
from registry.sql.models import Artifact, ArtifactEvidence, SmokeReportRow

POSTGRES_URL = os.environ.get(
    "ENGINECTL_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MODELS = 200
"""The default of --models."""
WARMUP = 50
TARGET_MS = 5.0
EXPLAIN_TARGET_MS = 10.0
SEED_VERSION = 1
"""Part of the cached rows' name: raise it when `artifact_rows` or `smoke_rows` change, or
a migration changes the columns of the seeded tables (`SEEDED`)."""
SEEDED = ("artifacts", "smoke_reports", "artifact_evidence")
GPUS = [gpu for gpu in CATALOG if not gpu.is_cpu]
KINDS = (["trtllm-engine"] * 12 + ["trtllm-checkpoint"] * 2 + ["vllm"] * 2
         + ["hf-checkpoint", "quantized-checkpoint", "converted-checkpoint", "hf-checkpoint"])
STATUSES = (["ready"] * 70 + ["built"] * 10 + ["superseded"] * 12 + ["quarantined"] * 3
            + ["deleted"] * 5)
QUANTS = ("bf16", "fp8", "int4_awq", "fp8", "nvfp4")
SERVABLE = ("trtllm-engine", "trtllm-checkpoint", "vllm")


def model_name(n: int) -> str:
    return f"model-{n:03d}"


def artifact_rows(count: int, models: int, rng: random.Random) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    rows = []
    for i in range(1, count + 1):
        kind = rng.choice(KINDS)
        gpu = rng.choice(GPUS) if kind in ("trtllm-engine", "trtllm-checkpoint") else None
        tp = rng.choice((1, 2, 4, 8))
        created = now - timedelta(seconds=rng.randrange(365 * 86400))
        trtllm = rng.choice(("0.16.0", "0.17.0", "0.18.1"))
        rows.append({
            "id": i,
            "digest": "sha256:" + hashlib.sha256(f"artifact-{i}".encode()).hexdigest(),
            "kind": kind,
            "key": "k1:" + hashlib.sha256(f"key-{i}".encode()).hexdigest(),
            "model": model_name(rng.randrange(models)),
            "runtime": {"vllm": "vllm", "trtllm-checkpoint": "trtllm-pytorch"}.get(kind, "trtllm"),
            "gpu": gpu.sku if gpu else None,
            "sm": gpu.sm if gpu else None,
            "quant": rng.choice(QUANTS),
            "kv_cache_dtype": rng.choice(("auto", "fp8")),
            "tp": tp,
            "pp": 1,
            "max_batch_size": rng.choice((8, 32, 64, 128, 256)),
            "max_input_len": 4096,
            "max_seq_len": rng.choice((2048, 4096, 8192, 32768)),
            "max_num_tokens": 8192,
            "toolchain": {"trtllm": trtllm, "tensorrt": "10.8.0", "cuda": "12.8",
                          "driver": "570.86", "torch": "2.6.0"},
            "labels": {"recipe": f"fleet-{i % 37}", "team": "inference", "tp": tp},
            "size": rng.randrange(1 << 30, 200 << 30),
            "file_count": tp + 3,
            "status": rng.choice(STATUSES),
            "status_reason": None,
            "recipe_digest": None,
            "best_tokens_per_s": None,
            "created_at": created,
            "updated_at": created,
        })
    return rows


def smoke_rows(artifacts: list[dict[str, Any]],
               rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Smoke reports, and the evidence rows they leave: (reports, evidence)."""
    rows = []
    evidence: dict[tuple[int, str], dict[str, Any]] = {}
    where = [gpu.sku for gpu in GPUS] + ["CPU"]
    for row in artifacts:
        if row["status"] != "ready" or row["kind"] not in SERVABLE or rng.random() > 0.3:
            continue
        for _ in range(rng.randint(1, 3)):
            gpu = row["gpu"] or rng.choice(where)
            rows.append({
                "artifact_id": row["id"],
                "passed": rng.random() < 0.9,
                "report": {"best_output_tokens_per_s": round(rng.uniform(100, 20000), 1),
                           "ttft_ms_p50": round(rng.uniform(10, 400), 1),
                           "concurrency": [1, 8, 32, 64]},
                "created_at": row["created_at"] + timedelta(hours=1),
                "gpu": gpu,
            })
            best = rows[-1]["report"]["best_output_tokens_per_s"]
            if rows[-1]["passed"] and best > (row["best_tokens_per_s"] or 0):
                row["best_tokens_per_s"] = best
            known = evidence.get((row["id"], gpu))
            if rows[-1]["passed"] and (known is None or best > known["best_tokens_per_s"]):
                evidence[(row["id"], gpu)] = {"artifact_id": row["id"], "gpu": gpu,
                                              "best_tokens_per_s": best,
                                              "passed_at": rows[-1]["created_at"]}
    return rows, list(evidence.values())


def seed(url: str, count: int, models: int, rng: random.Random) -> tuple[int, int, float]:
    artifacts = artifact_rows(count, models, rng)
    smoke, evidence = smoke_rows(artifacts, rng)
    start = time.perf_counter()
    with open_registry(url) as registry, registry.session() as session:
        for table, rows in ((Artifact.__table__, artifacts), (SmokeReportRow.__table__, smoke),
                            (ArtifactEvidence.__table__, evidence)):
            for first in range(0, len(rows), 5000):
                session.execute(table.insert(), rows[first:first + 5000])
    return len(artifacts), len(smoke), time.perf_counter() - start


def cached_name(args: argparse.Namespace) -> str:
    return f"resolve_r{args.rows}_m{args.models}_v{SEED_VERSION}"


def sqlite_seeded(path: Path, args: argparse.Namespace) -> None:
    """*path*: a SQLite registry with the bench's rows and no statistics; a copy of the
    cached one (seeded first when there is none, or with --reseed)."""
    if args.quick:
        seed_and_say("SQLite", f"sqlite:///{path}", args)
        return
    cached = CACHE / "resolve-scale" / f"{cached_name(args)}.db"
    if args.reseed or not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        building = cached.with_suffix(".building")
        for leftover in building.parent.glob(building.name + "*"):
            leftover.unlink()
        seed_and_say("SQLite", f"sqlite:///{building}", args)  # closed: the WAL is merged
        building.replace(cached)
    start = time.perf_counter()
    shutil.copyfile(cached, path)
    open_registry(f"sqlite:///{path}").close()  # migrated to the head, if behind
    log(f"SQLite: {cached} copied and migrated in {time.perf_counter() - start:.1f} s")


def seed_and_say(name: str, url: str, args: argparse.Namespace) -> None:
    rng = random.Random(1)  # noqa: S311 - reproducible test data, not secrets
    artifacts, reports, seconds = seed(url, args.rows, args.models, rng)
    print(f"{name}: seeded {artifacts} artifacts and {reports} smoke reports in "
          f"{seconds:.1f} s (load {loadavg()})")


def postgres_seeded(url: str, args: argparse.Namespace) -> None:
    """The fresh schema *url* names, migrated, with the rows of the cached schema (seeded
    first when there is none, or with --reseed) copied in: indexes, no statistics."""
    if args.quick:
        seed_and_say("PostgreSQL", url, args)
        return
    import psycopg
    from sqlalchemy.engine import make_url

    cached = f"bench_cache_{cached_name(args)}"
    admin_url = make_url(POSTGRES_URL).set(drivername="postgresql")
    with psycopg.connect(admin_url.render_as_string(hide_password=False), autocommit=True,
                         connect_timeout=10) as admin:
        present = admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                (cached,)).fetchone()
        if args.reseed or present is None:
            building = f"{cached}_building"
            admin.execute(f'DROP SCHEMA IF EXISTS "{building}" CASCADE')
            admin.execute(f'CREATE SCHEMA "{building}"')
            seed_and_say("PostgreSQL", make_url(POSTGRES_URL).update_query_dict(
                {"options": f"-csearch_path={building}"}).render_as_string(hide_password=False),
                args)
            admin.execute(f'DROP SCHEMA IF EXISTS "{cached}" CASCADE')
            admin.execute(f'ALTER SCHEMA "{building}" RENAME TO "{cached}"')
    open_registry(url).close()  # migrates the fresh schema
    schema = str(make_url(url).query["options"]).removeprefix("-csearch_path=")
    start = time.perf_counter()
    with psycopg.connect(admin_url.render_as_string(hide_password=False),
                         connect_timeout=10) as admin:
        for table in SEEDED:
            # names of our own making (SEEDED, the uuid schema, cached_name), no input
            admin.execute(f'INSERT INTO "{schema}".{table} '  # noqa: S608
                          f'SELECT * FROM "{cached}".{table}')
    log(f"PostgreSQL: rows of {cached} copied in {time.perf_counter() - start:.1f} s")


@contextmanager
def postgres_schema() -> Iterator[str]:
    import psycopg
    from sqlalchemy.engine import make_url

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin_url = make_url(POSTGRES_URL).set(drivername="postgresql")
    with psycopg.connect(admin_url.render_as_string(hide_password=False), autocommit=True,
                         connect_timeout=10) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
            yield url.render_as_string(hide_password=False)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def postgres_answers() -> bool:
    """Whether PostgreSQL answers at POSTGRES_URL; --quick leaves it out when it does not,
    except in CI (CI=true), where it must."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES_URL).set(drivername="postgresql")
    try:
        psycopg.connect(url.render_as_string(hide_password=False), connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            raise
        log(f"--quick: PostgreSQL at {POSTGRES_URL} does not answer ({exc}): left out")
        return False
    return True


def requests(count: int, models: int, rng: random.Random) -> list[Request]:
    return [Request(model=model_name(rng.randrange(models)), gpu=rng.choice(GPUS),
                    gpu_count=8, toolchain={"trtllm": "0.17.0"}) for _ in range(count)]


Timed = tuple[list[float], list[float]]
"""Per call: wall-clock ms, and the calling thread's CPU ms (what the machine's load does
not stretch: waits for the database server and for a core are not in it)."""


def latencies(call: Callable[[Request], object], batch: list[Request]) -> Timed:
    for request in batch[:WARMUP]:
        call(request)
    wall, cpu = [], []
    for request in batch:
        start, start_cpu = time.perf_counter(), time.thread_time()
        call(request)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
    return wall, cpu


Result = tuple[str, float, float, float, float]
"""(label, wall p50, wall p99, CPU p50, CPU p99), ms per call."""


def report(label: str, timed: Timed, target: float = TARGET_MS) -> Result:
    values, cpu = timed
    p99 = percentile(values, 99)
    print(f"  {label:<40} p50 {median(values):6.2f}  p90 {percentile(values, 90):6.2f}  "
          f"p99 {p99:6.2f}  max {max(values):6.2f} ms wall  "
          f"{'meets' if p99 < target else 'MISSES'} p99 < {target:.0f} ms  (load {loadavg()})")
    print(f"  {'  its own CPU time':<40} p50 {median(cpu):6.2f}  p90 {percentile(cpu, 90):6.2f}  "
          f"p99 {percentile(cpu, 99):6.2f}  max {max(cpu):6.2f} ms CPU")
    return label, median(values), p99, median(cpu), percentile(cpu, 99)


def explain(ctx: Context, model: str) -> None:
    """The plan of the statement resolve sends (`registry.sql.resolving`'s own text)."""
    from registry.sql.resolving import _statement

    gpu = GPUS[0].sku
    with ctx.reader.reading() as reader:
        sql, names = _statement(reader.dialect == "postgresql", every_status=False,
                                with_gpus=False)
        prefix = ("EXPLAIN QUERY PLAN " if reader.dialect == "sqlite"
                  else "EXPLAIN (ANALYZE, BUFFERS OFF) ")
        rows = reader.rows(prefix + sql, *({"model": model, "gpu": gpu}[n] for n in names))
    print(f"    plan of resolve's statement ({model}, {gpu}):")
    for row in rows:
        print(f"      {row[-1]}")


def profile(call: Callable[[Request], object], batch: list[Request]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for request in batch:
        call(request)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(18)
    text = out.getvalue()
    print(f"    cProfile, {len(batch)} calls, cumulative (top):")
    for line in text.splitlines():
        if line.strip() and ("{" in line or "/" in line or "ncalls" in line):
            print(f"      {line.rstrip()[:150]}")


def bench(name: str, url: str, home: Path, args: argparse.Namespace) -> list[Result]:
    print(f"\n{name} (load {loadavg()})")
    config = RegistryConfig(home=home, store_url=(home / "store").as_uri(),
                            s3_endpoint_url=None, registry_url=url, cache_dir=home / "cache")
    ctx = Context(config, readonly=True)  # as `enginectl resolve`, `pull` and `serve` open it
    results = []
    try:
        batch = requests(args.calls, args.models, random.Random(2))  # noqa: S311 - reproducible
        found = [len(resolve(ctx, r).candidates) for r in batch[:100]]
        print(f"  candidates per call: median {median(found)}, max {max(found)}")
        results.append(report("resolve, fresh",
                              latencies(lambda r: resolve(ctx, r), batch)))
        analyse(url)
        results.append(report("resolve, after ANALYZE",
                              latencies(lambda r: resolve(ctx, r), batch)))
        results.append(report("resolve(explain=True), after ANALYZE",
                              latencies(lambda r: resolve(ctx, r, explain=True), batch),
                              EXPLAIN_TARGET_MS))
        explain(ctx, model_name(min(7, args.models - 1)))
        profile(lambda r: resolve(ctx, r), batch[:200])
    finally:
        ctx.close()
    return [(f"{name}: {label}", *numbers) for label, *numbers in results]


def analyse(url: str) -> None:
    """ANALYZE the registry at *url* (the planner's statistics; SQLite's sqlite_stat1)."""
    from sqlalchemy import text

    with open_registry(url) as registry, registry.session() as session:
        session.execute(text("ANALYZE"))


def target_of(label: str) -> float:
    return EXPLAIN_TARGET_MS if "explain" in label else TARGET_MS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--models", type=int, default=MODELS,
                        help="models the rows are spread over (~500 rows a model: 2000 at 1M)")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgresql-only", action="store_true")
    parser.add_argument("--reseed", action="store_true",
                        help="generate the rows again instead of reusing the cached ones")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rows, args.models, args.calls = 300, 3, 60
    if args.models < 1 or args.rows < 1:
        parser.error("--rows and --models must be at least 1")
    print(f"machine: {machine()}")
    print(f"{args.rows} artifacts, {args.models} models; {args.calls} calls after {WARMUP} warm-up "
          "calls; latency in ms per resolve() call, in process")
    results = []
    with scratch("enginectl-resolve-") as tmp:
        if not args.postgresql_only:
            sqlite_seeded(tmp / "registry.db", args)
            results += bench("SQLite", f"sqlite:///{tmp / 'registry.db'}", tmp, args)
        if not args.sqlite_only and not (args.quick and not postgres_answers()):
            log("PostgreSQL …")
            with postgres_schema() as url:
                postgres_seeded(url, args)
                results += bench("PostgreSQL", url, tmp, args)
    print(f"\nsummary, ms per call (load {loadavg()}; wall stretches with the load, CPU "
          "does not):")
    print(f"{'':<56} {'wall p50':>9} {'wall p99':>9} {'CPU p50':>9} {'CPU p99':>9}")
    for label, wall50, wall99, cpu50, cpu99 in results:
        target = target_of(label)
        print(f"{label:<56} {wall50:9.2f} {wall99:9.2f} {cpu50:9.2f} {cpu99:9.2f}  "
              f"{'meets' if wall99 < target else 'MISSES'} p99 < {target:.0f} ms")

if __name__ == "__main__":
    main()
