"""The checks the smoke harness runs on a ready server (models, greedy, chat, stream, long
prompt, reference outputs), then the load (pipeline.serving.loadgen), and the body the load sends.

Each check is a `Check`: its verdict, a one-line message and its evidence. A transport error
fails the check it happens in instead of stopping the harness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pipeline.recipe.schema import SmokeSettings
from pipeline.serving.loadgen import (
    TRANSPORT_ERRORS,
    Client,
    LoadLevel,
    Response,
    run_level,
    token_agreement,
)

LONG_PROMPT_MARGIN: Final = 8  # tokens left under max_input_len (BOS and off-by-ones)
LONG_PROMPT_WORD: Final = "the"  # one token, with its leading space, in every tokenizer we serve
TEXT_LIMIT: Final = 200


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
    load = [run_level(client, probe.load_body(), settings.prompts, concurrency=c,
                      requests=settings.requests) for c in settings.concurrency]
    bad = next((level for level in load if level.errors or not level.output_tokens), None)
    levels = {str(level.concurrency): {"tokens_per_s": round(level.output_tokens_per_s, 3),
                                       "median_request_tokens_per_s":
                                       level.median_request_tokens_per_s,
                                       "errors": level.errors} for level in load}
    checks.append(Check(
        "load", bad is None,
        "no errors at any level" if bad is None else
        f"{bad.errors}/{bad.requests} requests failed at concurrency {bad.concurrency}"
        f" ({bad.first_error or 'no tokens'})",
        {"levels": levels}))
    return checks, load


def load_body(client: Client, served_name: str, settings: SmokeSettings) -> dict[str, Any]:
    """The streamed completion the load sends a ready server, with the optional fields it
    takes, learnt as the checks learn them (a greedy completion, then a stream)."""
    probe = _Probe(client, served_name, settings)
    probe.guard("greedy", probe.greedy)
    probe.guard("stream", probe.stream)
    return probe.load_body()


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

    def load_body(self) -> dict[str, Any]:
        return {"model": self.name, "max_tokens": self.settings.max_tokens, "temperature": 0,
                **self.extras, **self.stream_extras}

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
