"""Smoke serving (DESIGN §7): serve an artifact, prove it serves, measure it.

    report = smoke(SmokeServer(argv_template, model_dir, served_name, log_path),
                   settings=recipe.smoke, max_input_len=..., price_per_hour=...)

The server is started, awaited and stopped by pipeline.serving.server. Once it generates:
/v1/models names the model; greedy completions return exactly `max_tokens` tokens; a chat
completion through the chat template says something; a streamed completion gives the time to
first token; a prompt just under `max_input_len` is accepted whole; optional reference outputs
match (pipeline.serving.checks); and a short load at each concurrency level gives tokens/s,
TTFT p50/p95 and errors (pipeline.serving.loadgen).

`smoke` returns a report and does not raise for anything the server does; a report that did not
pass names its first failing check on one line. `measure` serves an artifact for its load alone
(the promotion gate's rounds, pipeline.serving.abgate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.recipe.schema import CapacitySettings, SmokeSettings
from pipeline.serving.capacity import Curve
from pipeline.serving.checks import Check, load_body, run_checks
from pipeline.serving.loadgen import Client, LoadLevel, cost_per_million_tokens, run_level
from pipeline.serving.server import NotReadyError, serving

# --- the report -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SmokeReport:
    passed: bool
    checks: list[Check]
    load: list[LoadLevel]
    ready_s: float | None  # cold start: process start to the first successful generation
    best_output_tokens_per_s: float | None
    cost_per_million_tokens: float | None  # at the best level, with price_per_hour
    price_per_hour: float | None
    log_path: Path
    argv: list[str]
    failure: str | None  # "<check>: <message>" of the first failing check
    warm_cache: str | None = None  # the warm cache the server started from (None: cold)
    warm_use: str | None = None  # what the runtime did with it: "used", "placed, not used (…)"
    warm_refused: str | None = None  # why this start is cold: its server failed warm
    capacity: Curve | None = None  # the open-loop curve, when the recipe asks for one

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values that any JSON column takes (registry.sql.smoke_records.add_smoke_report
        stores this): NUL characters a model may generate become U+2400 (␀), and a float
        that is not finite becomes None."""
        safe: dict[str, Any] = _json_safe({
            "passed": self.passed, "failure": self.failure, "ready_s": self.ready_s,
            "best_output_tokens_per_s": self.best_output_tokens_per_s,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "price_per_hour": self.price_per_hour, "log_path": str(self.log_path),
            "argv": list(self.argv), "warm_cache": self.warm_cache,
            "warm_use": self.warm_use, "warm_refused": self.warm_refused,
            "checks": [c.as_dict() for c in self.checks],
            "load": [level.as_dict() for level in self.load],
            **({"capacity": self.capacity.as_dict()} if self.capacity else {}),
        })
        return safe


def _json_safe(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\u2400")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


@dataclass(frozen=True)
class SmokeServer:
    """How a smoke starts its server: the argv (`{model_dir}` and `{port}` left to fill), the
    directory it serves, the name it answers to and its log; *env* adds to its environment,
    *cwd* is its working directory, and *warm_cache* names the warm cache it starts from
    (its ready_s is then a warm start)."""

    argv_template: Sequence[str]
    model_dir: Path
    served_name: str
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    warm_cache: str | None = None


def smoke(
    server: SmokeServer,
    *,
    settings: SmokeSettings,
    max_input_len: int,
    price_per_hour: float | None,
    reference: Sequence[tuple[str, str]] | None = None,
    threshold: float | None = None,
    gpus: int = 1,
) -> SmokeReport:
    """Start *server*, check it and load it (see the module doc).

    *reference* pairs a prompt with the text its greedy `settings.max_tokens`-token completion
    must be: exactly (*threshold* None, bf16), or with at least *threshold* of the tokens
    agreeing position by position (quantized). *price_per_hour* is one GPU's, of *gpus*."""
    argv_template, model_dir, served_name = (server.argv_template, server.model_dir,
                                             server.served_name)
    log_path, env, cwd, warm_cache = server.log_path, server.env, server.cwd, server.warm_cache
    checks: list[Check] = []
    load: list[LoadLevel] = []
    ready_s: float | None = None
    argv: list[str] = []
    curve: Curve | None = None
    try:
        with serving(argv_template, model_dir=model_dir, served_name=served_name,
                     settings=settings, log_path=log_path, env=env, cwd=cwd) as ready:
            argv, ready_s = ready.argv, ready.ready_s
            checks.append(Check("ready", True, f"generated after {ready_s:.1f} s",
                                {"ready_s": ready_s}))
            found, load = run_checks(ready.client, served_name, settings,
                                     max_input_len=max_input_len, reference=reference,
                                     threshold=threshold)
            checks += found
            if settings.capacity is not None and all(c.passed for c in checks):
                curve = _curve(ready.client, served_name, settings, settings.capacity)
            if (code := ready.server.poll()) is not None:
                checks.append(Check("alive", False, f"the server exited with code {code}",
                                    {"log_tail": ready.server.log_tail()}))
    except NotReadyError as exc:
        argv = exc.argv
        checks.append(Check("ready", False, exc.reason, {"argv": argv} if not exc.started
                            else {"cause": exc.cause, "log_tail": exc.log_tail}))
    best = max((level.output_tokens_per_s for level in load), default=None)
    failed = next((c for c in checks if not c.passed), None)
    return SmokeReport(
        passed=failed is None, checks=checks, load=load, ready_s=ready_s,
        best_output_tokens_per_s=best,
        cost_per_million_tokens=cost_per_million_tokens(price_per_hour, best, gpus),
        price_per_hour=price_per_hour, log_path=log_path, argv=argv,
        failure=None if failed is None else " ".join(f"{failed.name}: {failed.message}".split()),
        warm_cache=warm_cache, capacity=curve,
    )


def _curve(client: Client, served_name: str, settings: SmokeSettings,
           capacity: CapacitySettings) -> Curve:
    """The open-loop capacity curve (`pipeline.serving.openloop`) the recipe asks for."""
    from pipeline.serving.openloop import measure_curve

    return measure_curve(client, load_body(client, served_name, settings), settings.prompts,
                         capacity, max_tokens=settings.max_tokens)


def measure(
    argv_template: Sequence[str],
    *,
    model_dir: Path,
    served_name: str,
    settings: SmokeSettings,
    log_path: Path,
    env: Mapping[str, str] | None = None,
) -> list[LoadLevel]:
    """Serve *model_dir* with *argv_template* and run one round of the load at each of
    *settings*' concurrency levels (no checks: the artifact has passed its smoke), then stop
    the server. NotReadyError when it cannot start or never becomes ready."""
    with serving(argv_template, model_dir=model_dir, served_name=served_name,
                 settings=settings, log_path=log_path, env=env) as ready:
        body = load_body(ready.client, served_name, settings)
        return [run_level(ready.client, body, settings.prompts, concurrency=c,
                          requests=settings.requests) for c in settings.concurrency]
