"""The open-loop load: Poisson arrivals at increasing request rates, the capacity curve
(`pipeline.serving.capacity`) of a ready server.

Open loop: a request is sent at its arrival time whether or not the ones before it have
been answered (a closed loop, `pipeline.serving.loadgen.run_level`, waits, and so never
shows the queue a server builds when traffic outruns it). Arrival times are drawn from a
seeded `random.Random`: the same settings send the same schedule. Each request is one
streamed completion of the smoke's load body on its own thread; the rate's figures are
read once every request sent in its window has ended (or met the client's timeout).
Stdlib only: sockets through `pipeline.serving.loadgen.Client`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pipeline.recipe.schema import CapacitySettings
from pipeline.serving.capacity import Curve, RatePoint, StopReason, curve_of_rounds, stop_reason
from pipeline.serving.loadgen import TRANSPORT_ERRORS, Client, Streamed, percentile

MAX_IN_FLIGHT: Final = 1024  # requests on the wire at once; an arrival past it is an error


def arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """The send times (seconds from the start, ascending) of a Poisson process of *rate*
    per second within *duration_s*, at least one (at 0 when the draw gave none). Pure
    given *rng*."""
    found: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        found.append(at)
        at += rng.expovariate(rate)
    return found or [0.0]


def time_per_output_token(result: Streamed) -> float | None:
    """A streamed request's time per output token after the first: (end − first token) ÷
    (tokens − 1); None for fewer than two tokens or no first token."""
    tokens = result.completion_tokens if result.completion_tokens is not None else result.chunks
    if result.ttft_s is None or tokens < 2:
        return None
    return max(result.total_s - result.ttft_s, 0.0) / (tokens - 1)


def run_rate(
    client: Client, body: Mapping[str, Any], prompts: Sequence[str], *, rate: float,
    duration_s: float, seed: int,
    clock: Callable[[], float] = time.perf_counter,
) -> RatePoint:
    """Send *body* (prompts taken in turn) at Poisson arrivals of *rate* for *duration_s*,
    wait for every answer, and return what they met."""
    schedule = arrivals(rate, duration_s, random.Random(f"{seed}:{rate}"))  # noqa: S311 - a schedule
    results: list[tuple[float, Streamed]] = []  # (end time from the start, result)
    lock = threading.Lock()
    threads: list[threading.Thread] = []
    started = clock()

    def one(request: Mapping[str, Any]) -> None:
        try:
            result = client.stream("/v1/completions", request)
        except TRANSPORT_ERRORS as exc:
            result = Streamed(0, "", 0, None, None, None, 0.0, False,
                              f"{type(exc).__name__}: {exc}")
        with lock:
            results.append((clock() - started, result))

    skipped = 0
    for index, at in enumerate(schedule):
        if (wait := at - (clock() - started)) > 0:
            time.sleep(wait)
        if sum(thread.is_alive() for thread in threads[-MAX_IN_FLIGHT:]) >= MAX_IN_FLIGHT:
            skipped += 1
            continue
        request = {**body, "prompt": prompts[index % len(prompts)]}
        thread = threading.Thread(target=one, args=(request,), daemon=True,
                                  name="smoke-openloop")
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(client.timeout_s + 5)
    with lock:
        done = list(results)
    return _point(rate, duration_s, len(schedule), skipped, done)


def _point(rate: float, duration_s: float, sent: int, skipped: int,
           done: Sequence[tuple[float, Streamed]]) -> RatePoint:
    good = [r for _, r in done if r.error is None and r.status == 200]
    failed = [r for _, r in done if not (r.error is None and r.status == 200)]
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else r.chunks
                 for r in good)
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    tpots = [t for r in good if (t := time_per_output_token(r)) is not None]
    ends = [end for end, r in done if r.error is None and r.status == 200]
    span = max(ends, default=0.0)
    first_error = next((f"HTTP {r.status}: {r.error}" for r in failed), None)
    if skipped and first_error is None:
        first_error = f"{skipped} arrivals found {MAX_IN_FLIGHT} requests in flight"
    lost = sent - skipped - len(done)  # threads still waiting past the client's timeout
    return RatePoint(
        rate=rate, sent=sent, completed=len(good), errors=len(failed) + skipped + lost,
        duration_s=duration_s, ttft_p50_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95), tpot_p50_s=percentile(tpots, 50),
        tpot_p95_s=percentile(tpots, 95),
        latency_p50_s=percentile([r.total_s for r in good], 50),
        output_tokens=tokens, output_tokens_per_s=tokens / span if span > 0 else 0.0,
        first_error=first_error)


def measure_curve(
    client: Client, body: Mapping[str, Any], prompts: Sequence[str],
    settings: CapacitySettings, *, max_tokens: int,
) -> Curve:
    """*settings*' rounds, interleaved: each runs `run_rate` at the rates, lowest first, until
    a point passes a ceiling or fails requests (`pipeline.serving.capacity.stop_reason`);
    round *n* draws its arrivals from seed + *n*. The points of each
    rate combined (`pipeline.serving.capacity.curve_of_rounds`)."""
    ttft_ceiling, tpot_ceiling = settings.ttft_p95_ms / 1000, settings.tpot_p95_ms / 1000
    rates = tuple(settings.rates)
    rounds: list[tuple[list[RatePoint], StopReason]] = []
    for index in range(settings.rounds):
        points: list[RatePoint] = []
        stopped: StopReason = "rates"
        for rate in rates:
            point = run_rate(client, body, prompts, rate=rate,
                             duration_s=settings.duration_s, seed=settings.seed + index)
            points.append(point)
            if (reason := stop_reason(point, ttft_ceiling, tpot_ceiling)) is not None:
                stopped = reason
                break
        rounds.append((points, stopped))
    return curve_of_rounds(rounds, ttft_p95_ceiling_s=ttft_ceiling,
                           tpot_p95_ceiling_s=tpot_ceiling, duration_s=settings.duration_s,
                           max_tokens=max_tokens)
