"""What the smoke harness sends a ready server: an OpenAI-API client and the load (the checks
are pipeline.serving.checks).

Stdlib only (http.client, threads). One connection per request, so a client is safe to share
between threads. Streaming requests read the server-sent events (`data: {...}` lines, ended
by `data: [DONE]`) and time the first chunk that carries a choice: the time to first token.
Percentile, median, token agreement and cost are pure functions, for the report.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

# Errors a request to a live-or-dying server can raise; a check or a load request that meets
# one fails with its text instead of stopping the harness.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ValueError)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any  # the decoded JSON, or the raw text when it is not JSON

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def choices(self) -> list[Any]:
        choices = self.body.get("choices") if isinstance(self.body, dict) else None
        return choices if isinstance(choices, list) else []

    def usage(self, name: str) -> int | None:
        """usage.<name> (prompt_tokens, completion_tokens) when the answer has it."""
        usage = self.body.get("usage") if isinstance(self.body, dict) else None
        return _int_or_none(usage.get(name) if isinstance(usage, dict) else None)

    def error_text(self, limit: int = 300) -> str:
        """The body on one line, shortened: what a failed request said."""
        text = self.body if isinstance(self.body, str) else json.dumps(self.body)
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Streamed:
    """One streamed completion: its text, chunks, usage (when sent) and timings."""

    status: int
    text: str
    chunks: int
    completion_tokens: int | None  # usage.completion_tokens of the last chunk, when sent
    prompt_tokens: int | None
    ttft_s: float | None
    total_s: float
    done: bool  # the stream ended with `data: [DONE]`
    error: str | None


class Client:
    """JSON over HTTP to one OpenAI-compatible server on *host*:*port*."""

    def __init__(self, host: str, port: int, *, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s

    def _connection(self, timeout_s: float | None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(
            self.host, self.port, timeout=self.timeout_s if timeout_s is None else timeout_s
        )

    def request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
        timeout_s: float | None = None,
    ) -> Response:
        connection = self._connection(timeout_s)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {} if payload is None else {"Content-Type": "application/json"}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read().decode("utf-8", errors="replace")
        finally:
            connection.close()
        try:
            decoded: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            decoded = raw
        return Response(response.status, decoded)

    def get(self, path: str, *, timeout_s: float | None = None) -> Response:
        return self.request("GET", path, timeout_s=timeout_s)

    def post(
        self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Response:
        return self.request("POST", path, body, timeout_s=timeout_s)

    def stream(self, path: str, body: Mapping[str, Any]) -> Streamed:
        """POST *body* with `stream: true` and read the events to the end."""
        connection = self._connection(None)
        started = time.perf_counter()
        try:
            connection.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                text = response.read().decode("utf-8", errors="replace")
                return Streamed(response.status, "", 0, None, None, None,
                                time.perf_counter() - started, False,
                                Response(response.status, text).error_text())
            return _read_stream(response, started)
        finally:
            connection.close()


def _events(response: http.client.HTTPResponse) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, in order."""
    while line := response.readline():
        text = line.decode("utf-8", errors="replace").strip()
        if text.startswith("data:"):
            yield text[len("data:"):].strip()


def _read_stream(response: http.client.HTTPResponse, started: float) -> Streamed:
    parts: list[str] = []
    chunks = 0
    ttft: float | None = None
    usage: Mapping[str, Any] = {}
    done = False
    error: str | None = None
    for data in _events(response):
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            error = json.dumps(event["error"])
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            if ttft is None:
                ttft = time.perf_counter() - started
            chunks += 1
            delta = choice.get("delta")  # chat chunks carry a delta, completions a text
            text = choice.get("text") if delta is None else delta.get("content")
            parts.append(text or "")
    if not done and error is None:
        error = "the stream ended without data: [DONE]"
    return Streamed(200, "".join(parts), chunks, _int_or_none(usage.get("completion_tokens")),
                    _int_or_none(usage.get("prompt_tokens")), ttft,
                    time.perf_counter() - started, done, error)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


# --- report arithmetic ------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least *pct* % of the values at
    or below it (None for no values; pct 0 gives the minimum)."""
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, got {pct}")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def token_agreement(got: Sequence[object], expected: Sequence[object]) -> float:
    """The share of positions, over the longer sequence, where both have the same token."""
    longest = max(len(got), len(expected))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(got, expected, strict=False)) / longest


def cost_per_million_tokens(price_per_hour: float | None, tokens_per_s: float | None,
                            gpus: int = 1) -> float | None:
    """$ per 1M output tokens = price/hour × GPUs ÷ (tokens/s × 3600) × 10⁶, where
    *price_per_hour* is one GPU's (the recipe's `smoke.gpu_price_per_hour`) and *gpus* how many
    the artifact serves on (tp × pp; 1 on the CPU); None without a price or throughput."""
    if price_per_hour is None or tokens_per_s is None or tokens_per_s <= 0:
        return None
    return price_per_hour * gpus / (tokens_per_s * 3600) * 1e6


# --- load -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """One concurrency level of the load: *rounds* bursts of *requests* streamed completions,
    *concurrency* at a time.

    `output_tokens_per_s` is the bursts' tokens over their wall time: what the node delivered,
    shown in reports, but one slow burst moves it. The figures a verdict compares are robust:
    `median_request_tokens_per_s`, the median over every request of every round of its own
    completion tokens over its own time (from sending it to the end of its stream), and
    `median_ttft_s`, the median of the requests' times to first token. `round_medians` holds
    each round's median request tokens/s, which shows the spread between rounds."""

    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    first_error: str | None
    rounds: int = 1
    median_request_tokens_per_s: float | None = None
    median_ttft_s: float | None = None
    round_medians: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def median(values: Sequence[float]) -> float | None:
    """The median (the mean of the middle two for an even count); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def request_tokens_per_s(result: Streamed) -> float | None:
    """One request's own speed: its completion tokens (usage, else chunks) over its time."""
    tokens = result.completion_tokens if result.completion_tokens is not None else result.chunks
    return tokens / result.total_s if result.total_s > 0 and tokens else None


def run_level(
    client: Client,
    body: Mapping[str, Any],
    prompts: Sequence[str],
    *,
    concurrency: int,
    requests: int,
    rounds: int = 1,
) -> LoadLevel:
    """Send *rounds* bursts of max(*requests*, *concurrency*) streamed completions of *body*
    (prompts taken in turn) from *concurrency* threads; count completion tokens from each
    stream's usage (or its chunks when the server sends no usage)."""
    if concurrency < 1 or rounds < 1 or not prompts:
        raise ValueError("a load level needs concurrency ≥ 1, rounds ≥ 1 and a prompt")
    total = max(requests, concurrency)
    bodies = [{**body, "prompt": prompts[i % len(prompts)]} for i in range(total)]
    results: list[Streamed] = []
    wall = 0.0
    per_round: list[float] = []
    for _ in range(rounds):
        burst, seconds = _burst(client, bodies, concurrency)
        results += burst
        wall += seconds
        speeds = [s for r in burst if _good(r) and (s := request_tokens_per_s(r)) is not None]
        if (middle := median(speeds)) is not None:
            per_round.append(middle)
    good = [r for r in results if _good(r)]
    failed = [r for r in results if not _good(r)]
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else r.chunks
                 for r in good)
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    speeds = [s for r in good if (s := request_tokens_per_s(r)) is not None]
    return LoadLevel(
        concurrency=concurrency, requests=total * rounds, errors=len(failed),
        output_tokens=tokens, wall_s=wall,
        output_tokens_per_s=tokens / wall if wall > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50), ttft_p95_s=percentile(ttfts, 95),
        first_error=next((f"HTTP {r.status}: {r.error}" for r in failed), None),
        rounds=rounds, median_request_tokens_per_s=median(speeds), median_ttft_s=median(ttfts),
        round_medians=per_round,
    )


def _good(result: Streamed) -> bool:
    return result.error is None and result.status == 200


def _burst(client: Client, bodies: Sequence[Mapping[str, Any]], concurrency: int
           ) -> tuple[list[Streamed], float]:
    """Every body streamed once from *concurrency* threads; the results and the wall time."""

    def one(request: Mapping[str, Any]) -> Streamed:
        try:
            return client.stream("/v1/completions", request)
        except TRANSPORT_ERRORS as exc:
            return Streamed(0, "", 0, None, None, None, 0.0, False, f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="smoke-load") as pool:
        results = list(pool.map(one, bodies))
    return results, time.perf_counter() - started
