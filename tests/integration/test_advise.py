"""`enginectl advise` and `enginectl route` as a user runs them, on a real registry (file store
and SQLite) whose proofs carry capacity curves as a smoke records them (`history.record_smoke`:
the store's record, then the row); the curve survives `reindex` from the store alone; the
exit codes for nothing proven (6) and a bad objective (2)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.serving.capacity import Curve, RatePoint, curve_of_rounds
from registry.config import RegistryConfig
from registry.context import Context
from registry.ops import history
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.publish import publish
from registry.ops.reindex import reindex
from registry.sql import build_inputs
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import make_engine
from tests.integration.test_compare import checkpoint_dir

H100 = "H100-SXM5-80GB"
NOW = {"gpu": H100, "driver": "570.124.06", "cuda": "12.8", "trtllm": "1.2.1",
       "tensorrt": "10.14.1.48", "vllm": "0.32.0"}


def report_with(points: list[tuple[float, float, float]], *, price: float | None,
                stopped: str = "ttft") -> dict[str, Any]:
    """A passing report as SmokeReport.as_dict() gives it, with a curve of (rate, TTFT p95,
    request p50 time) points."""
    curve = Curve(tuple(
        RatePoint(rate=rate, sent=int(rate * 5), completed=int(rate * 5), errors=0,
                  duration_s=5.0, ttft_p50_s=ttft / 2, ttft_p95_s=ttft, tpot_p50_s=0.01,
                  tpot_p95_s=0.02, latency_p50_s=latency, output_tokens=int(rate * 5) * 32,
                  output_tokens_per_s=32 * rate) for rate, ttft, latency in points),
        2.0, 0.2, stopped, 5.0, 32)  # type: ignore[arg-type]
    return {"passed": True, "failure": None, "ready_s": 1.0,
            "best_output_tokens_per_s": 100.0, "cost_per_million_tokens": None,
            "price_per_hour": price, "log_path": "smoke.log", "argv": [], "checks": [],
            "load": [], "capacity": curve.as_dict()}


@dataclass
class Seeded:
    home: Path
    ctx: Context
    engine: str
    vllm: str
    nocurve: str


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    base = tmp_path_factory.mktemp("advise")
    home = base / "home"
    ctx = Context(RegistryConfig.from_env({"ENGINECTL_HOME": str(home)}))
    engine = publish(ctx, make_engine(base / "engine", seed=1), kind="trtllm-engine",
                     labels={"model": "m", "runtime": "trtllm", "gpu": H100, "sm": 90,
                             "quant": "fp8", "tp": 2, "pp": 1},
                     status="ready", key="k1:" + "ab" * 32).digest
    vllm = import_artifact(ctx, checkpoint_dir(base / "vllm", 4), ImportSpec(
        kind="vllm", model="m", quant="bf16", status="ready")).digest
    nocurve = import_artifact(ctx, checkpoint_dir(base / "other", 5), ImportSpec(
        kind="vllm", model="other", status="ready")).digest
    smoke = {engine: report_with([(2, 0.05, 0.4), (8, 0.1, 0.5), (16, 0.5, 1.2)], price=3.0),
             vllm: report_with([(1, 0.1, 0.5), (2, 0.2, 0.6), (4, 0.4, 0.9)], price=3.0),
             nocurve: {**report_with([(1, 0.1, 0.5)], price=1.0), "capacity": None}}
    for digest, report in smoke.items():
        history.record_smoke(ctx, digest, True, report, status="ready", gpu=H100,
                             toolchain=NOW)
    with ctx.registry.session() as session:
        build_inputs.record_toolchain(session, "host:builder", H100, NOW, "builder")
    yield Seeded(home, ctx, engine, vllm, nocurve)
    ctx.close()


def cli(home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env["ENGINECTL_HOME"] = str(home)
    done = run_cli([ENGINECTL, *args], env=env, timeout=120)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done


def test_advise_ranks_by_cost_and_names_each_proof(seeded: Seeded) -> None:
    done = cli(seeded.home, "advise", "--model", "m", "--ttft-p95", "300ms", "--rate", "20/s",
               "--json")
    advice = json.loads(done.stdout)
    engine, vllm = advice["ranked"]
    assert (engine["digest"], vllm["digest"]) == (seeded.engine, seeded.vllm)
    assert engine["capacity_rps"] == 8  # the last rate that held, not a reading toward 16
    assert engine["replicas"] == 3
    assert (engine["gpus"], engine["cost_per_hour"]) == (6, 18.0)
    assert vllm["capacity_rps"] == 2
    assert (vllm["replicas"], vllm["cost_per_hour"]) == (10, 30.0)
    assert engine["cost_per_million_tokens"] == pytest.approx(18.0 / (20 * 32 * 3600) * 1e6)
    assert engine["proof"]["fingerprint"]["driver"] == "570.124.06"

    text = cli(seeded.home, "advise", "--model", "m", "--ttft-p95", "300ms", "--rate", "20/s",
               "--price", "h100=1.5").stdout
    assert text.splitlines()[0] == "advise m: 20 requests/s within TTFT p95 300 ms"
    assert seeded.engine[:19] in text.splitlines()[2]  # first row: the cheapest
    assert " 9.00 " in text.splitlines()[2]  # 6 GPUs at the --price given


def test_nothing_meets_the_objective_says_the_nearest_and_by_how_much(seeded: Seeded) -> None:
    done = cli(seeded.home, "advise", "--model", "m", "--ttft-p95", "40ms", "--rate", "1/s",
               code=6)
    assert "nothing proven meets it; nearest: " + seeded.engine[:19] in done.stdout
    assert "TTFT p95 50 ms is 10 ms over 40 ms" in done.stdout
    assert "nothing meets 1 requests/s within TTFT p95 40 ms" in done.stderr


def test_a_model_with_nothing_proven_with_a_curve_is_exit_6(seeded: Seeded) -> None:
    done = cli(seeded.home, "advise", "--model", "other", "--ttft-p95", "300ms", "--rate",
               "2", code=6)
    assert "nothing proven to advise other from" in done.stderr
    assert "no capacity curve" in done.stderr
    unknown = cli(seeded.home, "route", "--model", "ohter", "--ttft-p95", "300ms", "--rate",
                  "2", "--json", code=6)
    assert "no artifact of model 'ohter' in the registry" in unknown.stderr
    assert "(it has m, other)" in unknown.stderr  # read on the driver, like resolve's


@pytest.mark.parametrize(("args", "message"), [
    (["--ttft-p95", "abc", "--rate", "2"], "--ttft-p95 'abc' is not a duration above zero"),
    (["--ttft-p95", "300ms", "--tpot-p95", "-1ms", "--rate", "2"], "--tpot-p95 '-1ms'"),
    (["--ttft-p95", "300ms", "--rate", "fast"], "--rate 'fast' is not a request rate"),
    (["--ttft-p95", "300ms", "--rate", "2", "--gpu", "h900"], "--gpu: unknown GPU 'h900'"),
])
def test_a_bad_objective_is_one_line_naming_the_option_and_value(
        seeded: Seeded, args: list[str], message: str) -> None:
    done = cli(seeded.home, "advise", "--model", "m", *args, code=2)
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_route_renders_each_format_from_one_manifest(seeded: Seeded, tmp_path: Path) -> None:
    slo = ["--model", "m", "--ttft-p95", "300ms", "--rate", "20/s"]
    manifest = json.loads(cli(seeded.home, "route", *slo, "--json").stdout)
    assert [v["digest"] for v in manifest["variants"]] == [seeded.engine, seeded.vllm]
    assert [v["role"] for v in manifest["variants"]] == ["primary", "fallback"]
    out = tmp_path / "pool.yaml"
    cli(seeded.home, "route", *slo, "--format", "inference-pool", "-o", str(out))
    kinds = [d["kind"] for d in yaml.safe_load_all(out.read_text())]
    assert kinds == ["InferencePool", "InferencePool", "HTTPRoute"]
    docs = list(yaml.safe_load_all(cli(seeded.home, "route", *slo, "--format",
                                       "envoy-ai-gateway", "--namespace", "llm").stdout))
    assert {d["metadata"]["namespace"] for d in docs} == {"llm"}
    done = cli(seeded.home, "route", *slo, code=2)
    assert "route needs --format" in done.stderr


def test_the_curve_comes_back_from_the_store_alone(seeded: Seeded, tmp_path: Path) -> None:
    slo = ["--model", "m", "--ttft-p95", "300ms", "--rate", "20/s", "--json"]
    before = json.loads(cli(seeded.home, "advise", *slo).stdout)
    fresh_home = tmp_path / "fresh"
    env = {"ENGINECTL_HOME": str(fresh_home),
           "ENGINECTL_STORE_URL": seeded.ctx.store.url}
    fresh = Context(RegistryConfig.from_env(env))
    try:
        restored = reindex(fresh)
    finally:
        fresh.close()
    assert restored.problems == []
    run = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    done = run_cli([ENGINECTL, "advise", *slo], env={**run, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout)
    assert [o["capacity_rps"] for o in after["ranked"]] == \
        [o["capacity_rps"] for o in before["ranked"]]
    assert [o["digest"] for o in after["ranked"]] == [o["digest"] for o in before["ranked"]]


def test_the_real_litellm_proxy_follows_the_route_and_falls_back(
        seeded: Seeded, tmp_path: Path) -> None:
    """LiteLLM's own proxy (the `litellm` package) with the config `route --format litellm`
    wrote, in front of two stand-in servers: the primary answers while it is up; once it is
    stopped, the fallback answers."""
    from pipeline.serving.server import free_port
    from tests.processes import FAKE_SERVER

    def server(name: str) -> tuple[subprocess.Popen[bytes], int, Path]:
        (tmp_path / name).mkdir()
        port, log = free_port(), tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(  # vLLM's spelling: it answers to the model's name only
                [sys.executable, str(FAKE_SERVER), "--model", str(tmp_path / name),
                 "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m"],
                stdout=out, stderr=subprocess.STDOUT)
        return proc, port, log

    primary, primary_port, primary_log = server("primary")
    fallback, fallback_port, fallback_log = server("fallback")
    config = tmp_path / "litellm.yaml"
    cli(seeded.home, "route", "--model", "m", "--ttft-p95", "300ms", "--rate", "20/s",
        "--format", "litellm", "--endpoint", f"primary=http://127.0.0.1:{primary_port}/v1",
        "--endpoint", f"fallback=http://127.0.0.1:{fallback_port}/v1", "-o", str(config))
    key = "sk-enginectl-test-" + "0" * 32
    proxy_port = free_port()
    proxy_log = tmp_path / "proxy.log"
    with proxy_log.open("wb") as out:
        proxy = subprocess.Popen(
            [str(Path(sys.executable).parent / "litellm"), "--config", str(config),
             "--host", "127.0.0.1", "--port", str(proxy_port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "LITELLM_MASTER_KEY": key},
            start_new_session=True)
    try:
        wait_until(lambda: _post(proxy_port, "/health/liveliness", None, key)[0] == 200,
                   proxy, proxy_log)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3}
        for _ in range(2):
            status, answer = _post(proxy_port, "/v1/chat/completions", body, key)
            assert status == 200, answer
        assert _answered(primary_log) == 2
        assert _answered(fallback_log) == 0

        primary.terminate()
        primary.wait(timeout=30)
        for _ in range(2):
            status, answer = _post(proxy_port, "/v1/chat/completions", body, key)
            assert status == 200, (answer, proxy_log.read_text()[-2000:])
            assert answer["choices"][0]["message"]["content"]
        assert _answered(fallback_log) == 2
    finally:
        for proc in (proxy, primary, fallback):
            proc.terminate()
        for proc in (proxy, primary, fallback):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _post(port: int, path: str, body: dict[str, Any] | None, key: str) -> tuple[int, Any]:
    """(status, decoded JSON) of a request to the proxy (GET without a body); (0, error)
    while it does not listen."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET" if body is None else "POST", path,
                           body=None if body is None else json.dumps(body),
                           headers={"Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return 0, str(exc)
    finally:
        connection.close()


def _answered(log: Path) -> int:
    return log.read_text().count("POST /v1/chat/completions")


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until *ready*, failing with the log's tail when *proc* exits or 240 s pass."""
    deadline = time.monotonic() + 240
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the LiteLLM proxy did not start: {log.read_text()[-3000:]}")
        time.sleep(0.25)


def test_show_prints_the_curve_and_compare_plots_it(seeded: Seeded, tmp_path: Path) -> None:
    shown = cli(seeded.home, "show", seeded.engine).stdout
    assert ("    curve   2/s 50/20 ms · 8/s 100/20 ms · 16/s 500/20 ms "
            "(TTFT/TPOT p95; stopped: ttft)") in shown
    page = tmp_path / "compare.html"
    cli(seeded.home, "compare", "--model", "m", "--html", str(page))
    text = page.read_text()
    chart = text[text.index('<svg id="capacity"'):]
    assert f'data-digest="{seeded.engine}"' in chart
    assert f'data-digest="{seeded.vllm}"' in chart
    assert "TTFT p95 ms" in chart
    rows = json.loads(cli(seeded.home, "compare", "--model", "m", "--json").stdout)["rows"]
    assert {r["digest"]: [p["rate"] for p in r["capacity"]] for r in rows}[seeded.vllm] == \
        [1, 2, 4]


def test_advise_reads_the_curve_on_each_registry_and_store(ctx: Context, tmp_path: Path) -> None:
    """The proof's curve read out of the report's JSON by the database, on SQLite and on
    PostgreSQL; a newer probe of the pool (a driver bump) leaves the proof unproven."""
    from pipeline.advise.advise import advise
    from pipeline.errors import NothingProvenError
    from pipeline.serving.capacity import Slo

    digest = import_artifact(ctx, checkpoint_dir(tmp_path / "v", 9), ImportSpec(
        kind="vllm", model="m", quant="bf16", status="built")).digest
    history.record_smoke(ctx, digest, True, report_with(
        [(1, 0.1, 0.5), (2, 0.2, 0.6), (4, 0.4, 0.9)], price=3.0), status="ready", gpu=H100,
        toolchain=NOW)
    (option,) = advise(ctx, "m", slo=Slo(0.3), rate=6).ranked
    assert (option.digest, option.capacity.rate, option.replicas) == (digest, 2, 3)
    with ctx.registry.session() as session:
        build_inputs.record_toolchain(session, "host:b", H100,
                                      {**NOW, "driver": "575.57.08"}, "b")
    with pytest.raises(NothingProvenError, match=r"driver 570\.124\.06 → 575\.57\.08"):
        advise(ctx, "m", slo=Slo(0.3), rate=6)


def test_a_build_records_the_curve_and_advise_follows_the_pool_fingerprint(
        tmp_path: Path) -> None:
    """End to end through the CLI, with the stand-ins of nvidia-smi, trtllm-build and
    trtllm-serve (one batch slot each, so traffic past it queues): `build` of a recipe with
    smoke.capacity proves each artifact with a curve; `show` prints it; advise ranks both
    TRT-LLM variants on the pool's fingerprint, and after a driver bump and the build that
    re-proves them, by the proofs on the new one. (SQLite: PostgreSQL reads the same curves
    in test_advise_reads_the_curve_on_each_registry_and_store.)"""
    from tests.integration.nightly_box import NEW, Box

    box = Box(tmp_path, f"sqlite:///{tmp_path / 'home' / 'registry.db'}", max_regression=0.99)
    recipe = yaml.safe_load(box.recipe.read_text())
    recipe["smoke"]["capacity"] = {"rates": [2, 60], "duration_s": 0.5, "ttft_p95_ms": 400,
                                   "rounds": 2}
    box.recipe.write_text(yaml.safe_dump(recipe))
    slow = {"FAKE_OPENAI_MAX_RUNNING": "1", "FAKE_OPENAI_TOKEN_DELAY_S": "0.01"}
    box.run("build", str(box.recipe), env=slow)

    listed = json.loads(box.run("ls", "--json").stdout)
    servable = [a["digest"] for a in listed if a["kind"] in ("trtllm-engine",
                                                            "trtllm-checkpoint")]
    assert len(servable) == 2
    shown = box.run("show", servable[0]).stdout
    assert "    curve   2/s " in shown
    assert "(TTFT/TPOT p95, the median of 2 rounds; stopped: " in shown
    advice = json.loads(box.run("advise", "--model", "toy", "--ttft-p95", "400ms", "--rate",
                                "1/s", "--json").stdout)
    assert sorted(o["digest"] for o in advice["ranked"]) == sorted(servable)
    for option in advice["ranked"]:
        assert option["gpu"] == H100
        assert option["proof"]["fingerprint"]["driver"] == "570.124.06"
        assert 2 <= option["capacity_rps"] < 60
    manifest = json.loads(box.run("route", "--model", "toy", "--ttft-p95", "400ms", "--rate",
                                  "1/s", "--json").stdout)
    # no price in the recipe: ranked by GPUs (one each), then by measured capacity
    assert [v["digest"] for v in manifest["variants"]] == \
        [o["digest"] for o in advice["ranked"]]
    assert [v["role"] for v in manifest["variants"]] == ["primary", "fallback"]

    box.bump(NEW)  # a driver bump: the build re-proves both on the pool's new fingerprint
    box.run("build", str(box.recipe), env=slow)
    advice = json.loads(box.run("advise", "--model", "toy", "--ttft-p95", "400ms", "--rate",
                                "1/s", "--json").stdout)
    assert {o["proof"]["fingerprint"]["driver"] for o in advice["ranked"]} == {NEW}


def _sample(rate: float, ttft: float) -> RatePoint:
    return RatePoint(rate=rate, sent=int(rate * 5), completed=int(rate * 5), errors=0,
                     duration_s=5.0, ttft_p50_s=ttft / 2, ttft_p95_s=ttft, tpot_p50_s=0.01,
                     tpot_p95_s=0.02, latency_p50_s=0.5, output_tokens=int(rate * 5) * 32,
                     output_tokens_per_s=32 * rate)


def test_curves_in_rounds_and_curves_from_before_rounds_both_serve_advise_show_and_compare(
        tmp_path: Path) -> None:
    """A proof whose curve was measured in three interleaved rounds (one slow round passed
    the ceiling at 8/s and never sent 16/s: the capacity is 4/s, the highest rate held in
    every round; 8/s held by the median round only, 16/s broke),
    beside a proof stored before rounds (one sample per rate, no `rounds` in its JSON):
    advise, show and compare read both."""
    home = tmp_path / "home"
    ctx = Context(RegistryConfig.from_env({"ENGINECTL_HOME": str(home)}))
    try:
        rounds = import_artifact(ctx, checkpoint_dir(tmp_path / "rounds", 11), ImportSpec(
            kind="vllm", model="r", quant="bf16", status="ready")).digest
        old = import_artifact(ctx, checkpoint_dir(tmp_path / "old", 12), ImportSpec(
            kind="vllm", model="r", quant="fp8", status="ready")).digest
        curve = curve_of_rounds([
            ([_sample(2, 0.1), _sample(4, 0.2), _sample(8, 0.25), _sample(16, 0.9)], "rates"),
            ([_sample(2, 0.1), _sample(4, 0.25), _sample(8, 2.5)], "ttft"),
            ([_sample(2, 0.1), _sample(4, 0.1), _sample(8, 0.2), _sample(16, 0.8)], "rates"),
        ], ttft_p95_ceiling_s=2.0, tpot_p95_ceiling_s=0.2, duration_s=5.0, max_tokens=32)
        before = report_with([(1, 0.1, 0.5), (2, 0.2, 0.6), (4, 0.4, 0.9)], price=3.0)
        for point in before["capacity"]["points"]:
            assert "rounds" not in point
        del before["capacity"]["rounds"]  # as a report from before rounds stored it
        for digest, report in ((rounds, {**before, "capacity": curve.as_dict()}),
                               (old, before)):
            history.record_smoke(ctx, digest, True, report, status="ready", gpu=H100,
                                 toolchain=NOW)
    finally:
        ctx.close()

    advice = json.loads(cli(home, "advise", "--model", "r", "--ttft-p95", "300ms", "--rate",
                            "8/s", "--json").stdout)
    found = {o["digest"]: o for o in advice["ranked"]}
    assert found[rounds]["capacity_rps"] == 4  # 8/s broke in one round of three
    assert found[rounds]["at_capacity"]["ttft_p95_s"] == 0.2  # the median round at 4/s
    assert found[rounds]["at_capacity"]["rounds"] == 3
    assert (found[old]["capacity_rps"], found[old]["at_capacity"]["rounds"]) == (2, 1)

    shown = cli(home, "show", rounds).stdout
    assert ("    curve   2/s 100/20 ms · 4/s 200/20 ms · 8/s 250/20 ms · "
            "16/s 850/20 ms [2 of 3] (TTFT/TPOT p95, the median of 3 rounds; stopped: ttft)"
            ) in shown
    assert ("    curve   1/s 100/20 ms · 2/s 200/20 ms · 4/s 400/20 ms "
            "(TTFT/TPOT p95; stopped: ttft)") in cli(home, "show", old).stdout
    page = tmp_path / "compare.html"
    cli(home, "compare", "--model", "r", "--html", str(page))
    chart = page.read_text().split('<svg id="capacity"', 1)[1]
    assert f'data-digest="{rounds}"' in chart
    assert f'data-digest="{old}"' in chart
    rows = json.loads(cli(home, "compare", "--model", "r", "--json").stdout)["rows"]
    assert {r["digest"]: [p["rate"] for p in r["capacity"]] for r in rows} == \
        {rounds: [2, 4, 8, 16], old: [1, 2, 4]}
