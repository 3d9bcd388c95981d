"""What the smoke harness sends a ready server: an OpenAI-API client, the checks, the load.

Stdlib only (http.client, threads). One connection per request, so a client is safe to share
between threads. Streaming requests read the server-sent events (`data: {...}` lines, ended
by `data: [DONE]`) and time the first chunk that carries a choice: the time to first token.
Percentile, token agreement and cost are pure functions, for the report.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pipeline.recipe import SmokeSettings

# Errors a request to a live-or-dying server can raise; a check or a load request that meets
# one fails with its text instead of stopping the harness.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ValueError)
LONG_PROMPT_MARGIN: Final = 8  # tokens left under max_input_len (BOS and off-by-ones)
LONG_PROMPT_WORD: Final = "the"  # one token, with its leading space, in every tokenizer we serve
TEXT_LIMIT: Final = 200


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


def cost_per_million_tokens(price_per_hour: float | None, tokens_per_s: float | None
                            ) -> float | None:
    """$ per 1M output tokens = price/hour ÷ (tokens/s × 3600) × 10⁶; None without a price or
    without throughput."""
    if price_per_hour is None or tokens_per_s is None or tokens_per_s <= 0:
        return None
    return price_per_hour / (tokens_per_s * 3600) * 1e6


# --- load -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """One concurrency level of the load: *requests* streamed completions, *concurrency* at a
    time."""

    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    first_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_level(
    client: Client,
    body: Mapping[str, Any],
    prompts: Sequence[str],
    *,
    concurrency: int,
    requests: int,
) -> LoadLevel:
    """Send max(*requests*, *concurrency*) streamed completions of *body* (prompts taken in
    turn) from *concurrency* threads; count completion tokens from each stream's usage (or
    its chunks when the server sends no usage)."""
    if concurrency < 1 or not prompts:
        raise ValueError("a load level needs concurrency ≥ 1 and at least one prompt")
    total = max(requests, concurrency)
    bodies = [{**body, "prompt": prompts[i % len(prompts)]} for i in range(total)]

    def one(request: Mapping[str, Any]) -> Streamed:
        try:
            return client.stream("/v1/completions", request)
        except TRANSPORT_ERRORS as exc:
            return Streamed(0, "", 0, None, None, None, 0.0, False, f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="smoke-load") as pool:
        results = list(pool.map(one, bodies))
    wall = time.perf_counter() - started
    good = [r for r in results if r.error is None and r.status == 200]
    failed = [r for r in results if r.error is not None or r.status != 200]
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else r.chunks
                 for r in good)
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    return LoadLevel(
        concurrency=concurrency, requests=total, errors=len(failed), output_tokens=tokens,
        wall_s=wall, output_tokens_per_s=tokens / wall if wall > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50), ttft_p95_s=percentile(ttfts, 95),
        first_error=next((f"HTTP {r.status}: {r.error}" for r in failed), None),
    )


# --- the checks -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """One check: its verdict, a one-line message and the numbers or text that prove it."""

    name: str
    passed: bool
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks(
    client: Client, served_name: str, settings: SmokeSettings, *, max_input_len: int,
    reference: Sequence[tuple[str, str]] | None = None, threshold: float | None = None,
) -> tuple[list[Check], list[LoadLevel]]:
    """The checks of a ready server, then (when all of them pass) the load."""
    probe = _Probe(client, served_name, settings)
    checks = [
        probe.guard("models", probe.models),
        probe.guard("greedy", probe.greedy),
        probe.guard("chat", probe.chat),
        probe.guard("stream", probe.stream),
        probe.guard("long_prompt", lambda: probe.long_prompt(max_input_len)),
    ]
    if reference:
        checks.append(probe.guard("reference", lambda: probe.reference(reference, threshold)))
    if not all(check.passed for check in checks):
        return checks, []
    body = {"model": served_name, "max_tokens": settings.max_tokens, "temperature": 0,
            **probe.extras, **probe.stream_extras}
    load = [run_level(client, body, settings.prompts, concurrency=c, requests=settings.requests)
            for c in settings.concurrency]
    bad = next((level for level in load if level.errors or not level.output_tokens), None)
    levels = {str(level.concurrency): {"tokens_per_s": round(level.output_tokens_per_s, 3),
                                       "errors": level.errors} for level in load}
    checks.append(Check(
        "load", bad is None,
        "no errors at any level" if bad is None else
        f"{bad.errors}/{bad.requests} requests failed at concurrency {bad.concurrency}"
        f" ({bad.first_error or 'no tokens'})",
        {"levels": levels}))
    return checks, load


class _Probe:
    """The checks, sharing what the first ones learn (which optional request fields the
    server takes)."""

    def __init__(self, client: Client, name: str, settings: SmokeSettings) -> None:
        self.client = client
        self.name = name
        self.settings = settings
        self.extras: dict[str, Any] = {"ignore_eos": True}
        self.stream_extras: dict[str, Any] = {"stream_options": {"include_usage": True}}
        self._tokenizes: bool | None = None

    def guard(self, name: str, check: Callable[[], Check]) -> Check:
        """Run *check*; a transport error (refused, reset, timeout, bad JSON) fails it."""
        try:
            return check()
        except TRANSPORT_ERRORS as exc:
            return Check(name, False, f"{type(exc).__name__}: {exc}", {})

    def _greedy_body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return {"model": self.name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, **self.extras}

    def _complete(self, prompt: str, max_tokens: int) -> Response:
        answer = self.client.post("/v1/completions", self._greedy_body(prompt, max_tokens))
        if answer.status == 400 and "ignore_eos" in answer.error_text() and self.extras:
            self.extras = {}  # refused: counts may then stop early at EOS
            answer = self.client.post("/v1/completions", self._greedy_body(prompt, max_tokens))
        return answer

    def models(self) -> Check:
        answer = self.client.get("/v1/models")
        data = answer.body.get("data") if isinstance(answer.body, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        passed = answer.ok and self.name in ids
        return Check("models", passed, f"serves {self.name!r}" if passed else
                     f"{self.name!r} not among {ids} (HTTP {answer.status})",
                     {"status": answer.status, "ids": ids})

    def greedy(self) -> Check:
        wanted = self.settings.max_tokens
        outputs: list[dict[str, Any]] = []
        for prompt in self.settings.prompts:
            answer = self._complete(prompt, wanted)
            if not answer.ok or not answer.choices:
                return Check("greedy", False, f"HTTP {answer.status}: {answer.error_text()}",
                             {"prompt": prompt, "status": answer.status})
            choice = answer.choices[0]
            outputs.append({"prompt": prompt, "text": choice.get("text"),
                            "completion_tokens": answer.usage("completion_tokens"),
                            "finish_reason": choice.get("finish_reason")})
        bad = next((o for o in outputs if o["completion_tokens"] != wanted), None)
        ignore_eos = "accepted" if self.extras else "refused by the server; not sent"
        return Check("greedy", bad is None,
                     f"{len(outputs)} completions of {wanted} tokens" if bad is None else
                     f"asked for {wanted} tokens, usage.completion_tokens is "
                     f"{bad['completion_tokens']} for {bad['prompt']!r}",
                     {"max_tokens": wanted, "ignore_eos": ignore_eos, "outputs": outputs})

    def chat(self) -> Check:
        body = {"model": self.name, "max_tokens": self.settings.max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": self.settings.prompts[0]}],
                **self.extras}
        answer = self.client.post("/v1/chat/completions", body)
        choices = answer.choices
        message = choices[0].get("message") if choices else None
        content = message.get("content") if isinstance(message, dict) else None
        passed = answer.ok and isinstance(content, str) and bool(content.strip())
        return Check("chat", passed, "the chat template answered" if passed else
                     f"HTTP {answer.status}: no content ({answer.error_text()})",
                     {"status": answer.status, "content": _short(content),
                      "completion_tokens": answer.usage("completion_tokens")})

    def stream(self) -> Check:
        body = {**self._greedy_body(self.settings.prompts[0], self.settings.max_tokens),
                **self.stream_extras}
        result = self.client.stream("/v1/completions", body)
        if result.status == 400 and "stream_options" in (result.error or ""):
            self.stream_extras = {}
            body.pop("stream_options")
            result = self.client.stream("/v1/completions", body)
        passed = result.error is None and result.ttft_s is not None
        return Check("stream", passed, f"first token after {result.ttft_s:.3f} s"
                     if passed and result.ttft_s is not None
                     else f"HTTP {result.status}: {result.error or 'no chunk with a choice'}",
                     {"status": result.status, "ttft_s": result.ttft_s, "total_s": result.total_s,
                      "chunks": result.chunks, "completion_tokens": result.completion_tokens,
                      "text": _short(result.text)})

    def _tokens(self, text: str, *, special: bool) -> list[int] | None:
        """The server's tokens of *text* from /tokenize (vLLM has it); None without it."""
        if self._tokenizes is False:
            return None
        answer = self.client.post("/tokenize", {"model": self.name, "prompt": text,
                                                "add_special_tokens": special})
        tokens = answer.body.get("tokens") if isinstance(answer.body, dict) else None
        self._tokenizes = answer.ok and isinstance(tokens, list)
        return list(tokens) if self._tokenizes and isinstance(tokens, list) else None

    def _prompt_tokens(self, words: int) -> tuple[int | None, Response | None]:
        """How many tokens the server makes of a *words*-word prompt: /tokenize's count, or
        else usage.prompt_tokens of a one-token completion (with that answer)."""
        tokens = self._tokens(_words(words), special=True)
        if tokens is not None:
            return len(tokens), None
        answer = self._complete(_words(words), 1)
        return answer.usage("prompt_tokens"), answer

    def long_prompt(self, max_input_len: int) -> Check:
        target = max(1, max_input_len - LONG_PROMPT_MARGIN)
        small, large = (8, 16) if target > 16 else (1, 2)
        (count_small, _), (count_large, _) = (self._prompt_tokens(n) for n in (small, large))
        if count_small is None or count_large is None or count_large <= count_small:
            return Check("long_prompt", False, "cannot count prompt tokens on this server",
                         {"counts": {small: count_small, large: count_large}})
        per_word = (count_large - count_small) / (large - small)
        words = max(1, math.floor((target - (count_small - per_word * small)) / per_word))
        counted_by = "/tokenize" if self._tokenizes else "usage.prompt_tokens, extrapolated"
        if self._tokenizes:
            expected = self._prompt_tokens(words)[0] or 0
            for _ in range(5):
                if expected <= target or words == 1:
                    break
                words = max(1, words - math.ceil((expected - target) / per_word))
                expected = self._prompt_tokens(words)[0] or 0
        else:
            expected = round(count_small + per_word * (words - small))
        answer = self._complete(_words(words), 1)
        reported = answer.usage("prompt_tokens")
        evidence = {"max_input_len": max_input_len, "words": words, "expected": expected,
                    "counted_by": counted_by, "reported": reported, "status": answer.status}
        if not answer.ok:
            return Check("long_prompt", False, f"a {expected}-token prompt was refused: HTTP "
                         f"{answer.status}: {answer.error_text()}", evidence)
        passed = reported == expected and expected <= max_input_len
        return Check("long_prompt", passed,
                     f"a {expected}-token prompt was accepted whole" if passed else
                     f"sent {expected} prompt tokens (by {counted_by}), the server counted "
                     f"{reported}: truncated", evidence)

    def reference(self, pairs: Sequence[tuple[str, str]], threshold: float | None) -> Check:
        rows: list[dict[str, Any]] = []
        for prompt, expected in pairs:
            answer = self._complete(prompt, self.settings.max_tokens)
            choices = answer.choices
            got = choices[0].get("text") if answer.ok and choices else None
            if not isinstance(got, str):
                return Check("reference", False, f"HTTP {answer.status}: "
                             f"{answer.error_text()}", {"prompt": prompt})
            if threshold is None:
                agreement = 1.0 if got == expected else 0.0
            else:
                got_tokens = self._tokens(got, special=False) or got.split()
                want_tokens = self._tokens(expected, special=False) or expected.split()
                agreement = token_agreement(got_tokens, want_tokens)
            rows.append({"prompt": prompt, "expected": expected, "got": got,
                         "agreement": agreement})
        need = 1.0 if threshold is None else threshold
        worst = min(rows, key=lambda row: float(row["agreement"]))
        passed = worst["agreement"] >= need
        how = "exactly" if threshold is None else f"with ≥ {threshold:.0%} of tokens agreeing"
        return Check("reference", passed, f"{len(rows)} outputs match {how}" if passed else
                     f"{worst['prompt']!r} gave {worst['got']!r}, expected "
                     f"{worst['expected']!r} ({how})",
                     {"threshold": threshold, "outputs": rows})


def _words(count: int) -> str:
    return " ".join([LONG_PROMPT_WORD] * count)


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_LIMIT:
        return text
    return text[: TEXT_LIMIT - 1] + "…"
