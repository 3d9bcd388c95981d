"""Does `enginectl advise` tell the truth for the tiny model? Its answer checked against a
separate open-loop run.

Run: `.venv/bin/python bench/advise_check.py [--slo-ms 250] [--rates 4,8,16,32,64]
[--duration 10] [--check-duration 15] [--rounds 3] [--check-rounds N] [--settle 20]` from the
repository root (≈10–20 min on 2 cores; skipped with a message when `scripts/install-vllm
--check` fails).

1. vLLM's CPU build serves the tiny Llama (`scripts/make_tiny_model.py`; the argv a vLLM
   manifest stores, `--enforce-eager`, max-num-seqs 4) through `smoke()` with
   `smoke.capacity` set: the open-loop curve at each of --rates for --duration s, in --rounds
   interleaved rounds (each goes up the rates until TTFT p95 passes 4 × the objective, then
   the next starts again from the lowest: `smoke.capacity.rounds`).
2. The report is recorded as the proof of an imported vLLM entry in a fresh registry
   (`history.record_smoke`, as a build records it), and `enginectl advise --ttft-p95 SLO`
   reads the capacity off it (the highest rate the objective held at in every round, every
   lower rate holding in more than half of them: pipeline.serving.capacity).
3. A second server, new schedules (other seeds): `run_rate` at the advised capacity and at
   1.5× it, --check-duration s each, interleaved for --check-rounds rounds (default:
   --rounds), so that a neighbour's load falls on both sides alike. The claim holds when the
   median of the rounds' TTFT p95 is within the objective at the capacity and beyond it at
   1.5×. After each 1.5× run the server is left --settle s alone: an overload's after-effects
   measured 2× the TTFT p95 of a capacity run that followed it at once.

`--quick` checks that the script runs, in seconds and without vLLM: the same three steps
against the stdlib stand-in server (tests/fakes/openai_server.py), two rates of a second
each in two rounds, one check round; its verdict means nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _support import ENGINECTL, add_quick, exit_on_signals, loadavg, log, machine, quick_mode
from smoke_overhead import VLLM_ENV, fake_template, tiny_model, vllm_python, vllm_template

from pipeline.recipe.fields import MAX_CAPACITY_ROUNDS
from pipeline.recipe.schema import CapacitySettings, SmokeSettings
from pipeline.serving.checks import load_body
from pipeline.serving.openloop import run_rate
from pipeline.serving.server import serving
from pipeline.serving.smoke import SmokeServer, smoke
from registry.config import RegistryConfig
from registry.context import Context
from registry.ops import history
from registry.ops.adopt import ImportSpec, import_artifact

MODEL = "tiny-llama"
PROMPTS = ["The capital of France is", "Write a haiku about GPUs."]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--slo-ms", type=float, default=250.0, help="TTFT p95 objective")
    parser.add_argument("--rates", default="4,8,16,32,64", help="the curve's requests/s")
    parser.add_argument("--duration", type=float, default=10.0, help="s per curve rate")
    parser.add_argument("--check-duration", type=float, default=15.0,
                        help="s of each check run")
    parser.add_argument("--rounds", type=_rounds, default=3,
                        help="the curve's rounds, interleaved (smoke.capacity.rounds)")
    parser.add_argument("--check-rounds", type=_rounds, default=None,
                        help="check rounds, interleaved (default: --rounds)")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="s of quiet after each 1.5x run, before the next run")
    parser.add_argument("--max-tokens", type=int, default=16)
    add_quick(parser)
    args = parser.parse_args()
    exit_on_signals()
    quick = quick_mode(args.quick)
    if quick:
        args.rates, args.duration, args.check_duration = "4,8", 1.0, 1.0
        args.rounds, args.check_rounds, args.settle = 2, 1, 0.0
    if args.check_rounds is None:
        args.check_rounds = args.rounds
    with tempfile.TemporaryDirectory(prefix="advise-check-") as tmp:
        if quick:  # the stand-in answers at once: a config.json makes a model of a folder
            model = Path(tmp) / "model"
            model.mkdir()
            (model / "config.json").write_text('{"model_type": "llama"}')
            check(args, fake_template(), model, Path(tmp) / "work")
            return
        python = vllm_python()
        if python is None:
            return
        check(args, vllm_template(python), tiny_model(), Path(tmp) / "work")


def check(args: argparse.Namespace, template: list[str], model: Path, work: Path) -> None:
    """The three steps with the server *template* serving *model*, scratch under *work*."""
    work.mkdir()
    rates = [float(r) for r in args.rates.split(",")]
    settings = SmokeSettings(
        prompts=PROMPTS, max_tokens=args.max_tokens, concurrency=[1], requests=4,
        ready_timeout_s=900, request_timeout_s=120,
        capacity=CapacitySettings(rates=rates, duration_s=args.duration,
                                  ttft_p95_ms=4 * args.slo_ms, tpot_p95_ms=10_000,
                                  rounds=args.rounds))
    log(f"machine: {machine()}; load average {loadavg()}")
    log(f"1. smoke with the capacity curve, {args.rounds} rounds ...")
    report = smoke(SmokeServer(template, model, MODEL, work / "smoke.log", env=VLLM_ENV),
                   settings=settings, max_input_len=128, price_per_hour=0.10)
    if not report.passed or report.capacity is None:
        sys.exit(f"the smoke failed: {report.failure} (log {work / 'smoke.log'})")
    log(f"   load average {loadavg()}; per rate: the median round's p95s, p50 "
        "and tokens/s, then each round's TTFT p95")
    log("   rate  sent  errors  TTFT p50 / p95 ms  TPOT p95 ms  out tok/s  rounds' TTFT p95 ms")
    for p in report.capacity.points:
        each = ", ".join(_ms(s.ttft_p95_s) for s in p.samples)
        log(f"   {p.rate:5g} {p.sent:5d} {p.errors:6d}  {_ms(p.ttft_p50_s):>7} / "
            f"{_ms(p.ttft_p95_s):>6}  {_ms(p.tpot_p95_s):>10}  {p.output_tokens_per_s:8.1f}"
            f"  {each} ({len(p.samples)} of {report.capacity.rounds})")
    log(f"   stopped: {report.capacity.stopped}")

    home = work / "home"
    ctx = Context(RegistryConfig.from_env({"ENGINECTL_HOME": str(home)}))
    try:
        digest = import_artifact(ctx, model, ImportSpec(
            kind="vllm", model=MODEL, quant="bf16", status="built")).digest
        history.record_smoke(ctx, digest, True, report.as_dict(), status="ready",
                             gpu="CPU", toolchain={"vllm": "0.32.0"})
    finally:
        ctx.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    done = subprocess.run(
        [ENGINECTL, "advise", "--model", MODEL, "--ttft-p95", f"{args.slo_ms:g}ms",
         "--rate", "1/s", "--json"], env={**env, "ENGINECTL_HOME": str(home)},
        capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        sys.exit(f"2. advise exit {done.returncode}: {done.stderr.strip()}")
    (row,) = json.loads(done.stdout)["ranked"]
    capacity = float(row["capacity_rps"])
    log(f"2. advise: capacity {capacity:.2f} requests/s at TTFT p95 {args.slo_ms:g} ms"
        + (" (a lower bound: every rate held)" if row["capacity_is_lower_bound"] else ""))

    log(f"3. check runs on a second server, {args.check_rounds} rounds ...")
    p95s = check_runs(template, model, settings, work, capacity=capacity, args=args)
    slo = args.slo_ms / 1000
    middle = {label: statistics.median(values) for label, values in p95s.items()}
    holds, breaks = middle["capacity"] <= slo, middle["1.5 × capacity"] > slo
    log(f"verdict: median TTFT p95 {_ms(middle['capacity'])} ms at the advised capacity "
        f"({'holds' if holds else 'does NOT hold'}), {_ms(middle['1.5 × capacity'])} ms at "
        f"1.5× ({'breaks' if breaks else 'does NOT break'}) against {args.slo_ms:g} ms")


def check_runs(template: list[str], model: Path, settings: SmokeSettings, work: Path, *,
               capacity: float, args: argparse.Namespace) -> dict[str, list[float]]:
    """TTFT p95 (inf when requests failed) per round at the capacity and at 1.5× it,
    interleaved, on a server of its own."""
    check = settings.model_copy(update={"capacity": None})
    p95s: dict[str, list[float]] = {"capacity": [], "1.5 × capacity": []}
    with serving(template, model_dir=model, served_name=MODEL, settings=check,
                 log_path=work / "check.log", env={**VLLM_ENV, "BENCH": uuid.uuid4().hex}
                 ) as ready:
        body = load_body(ready.client, MODEL, check)
        for round_ in range(args.check_rounds):
            for label, rate in (("capacity", capacity), ("1.5 × capacity", 1.5 * capacity)):
                p = run_rate(ready.client, body, PROMPTS, rate=rate,
                             duration_s=args.check_duration, seed=7 + round_)
                p95s[label].append(math.inf if p.errors or p.ttft_p95_s is None
                                   else p.ttft_p95_s)
                log(f"   round {round_ + 1} {label:>14}: {rate:6.2f} requests/s, {p.sent} "
                    f"sent, {p.errors} errors, TTFT p50 {_ms(p.ttft_p50_s)} ms, p95 "
                    f"{_ms(p.ttft_p95_s)} ms; load average {loadavg()}")
                if label != "capacity":  # an overload's after-effects stay out of the next run
                    time.sleep(args.settle)
    return p95s


def _rounds(text: str) -> int:
    """--rounds and --check-rounds: a whole number of rounds, as smoke.capacity.rounds."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CAPACITY_ROUNDS:
        raise argparse.ArgumentTypeError(
            f"not a number of rounds from 1 to {MAX_CAPACITY_ROUNDS}: {text!r}")
    return value


def _ms(seconds: float | None) -> str:
    if seconds is None or math.isinf(seconds):
        return "-"
    return f"{seconds * 1000:.0f}"


if __name__ == "__main__":
    main()
