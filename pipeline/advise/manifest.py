"""The neutral routing manifest: which proven variants serve a model, in what order, and with
what limits, as `enginectl route --json` prints it and as every router format is rendered from
(`pipeline.advise.routers`). Pure.

Variants (from the advice's ranking, `pipeline.advise.decide`): the primary is the first of
the ranking; the fallback is the best-ranked option of the other runtime family (TRT-LLM's
engines and checkpoints on one side, vLLM on the other), else the second of the ranking. So
an engine that is cheapest leads and the best vLLM entry backs it up; when vLLM ranks first,
it leads and the best TRT-LLM option backs it up.

Each variant's limits follow from its measured capacity at the objective, for its replicas
together: `rpm` = floor(capacity × replicas × 60), and `max_parallel_requests` = ceil(capacity
× replicas × the requests' p50 time at that rate) — Little's law: what is in flight at that
rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pipeline.advise.decide import Advice, Option
from registry.errors import UsageError

PORT: Final = 8000  # the port a variant's Service listens on (enginectl pull --port's default)
_NOT_DNS: Final = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class Variant:
    name: str  # DNS-1123 label: the Service, pool and deployment name
    role: str  # "primary" or "fallback"
    priority: int  # 0 first
    option: Option
    endpoint: str  # the OpenAI API base URL the router sends to
    rpm: int
    max_parallel_requests: int

    def as_dict(self) -> dict[str, Any]:
        option = self.option.as_dict()
        return {"name": self.name, "role": self.role, "priority": self.priority,
                "endpoint": self.endpoint, "rpm": self.rpm,
                "max_parallel_requests": self.max_parallel_requests, **option}


@dataclass(frozen=True, slots=True)
class RouteManifest:
    model: str
    advice: Advice
    variants: tuple[Variant, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "enginectl-route", "version": 1, "model": self.model,
                "slo": self.advice.slo.as_dict(), "rate": self.advice.rate,
                "variants": [v.as_dict() for v in self.variants]}


def dns_label(text: str) -> str:
    """*text* as a DNS-1123 label: lower case, runs of other characters as `-`, at most 63."""
    return _NOT_DNS.sub("-", text.lower()).strip("-")[:63].strip("-") or "model"


def variant_name(model: str, option: Option) -> str:
    """`tiny-llama-vllm-1a2b3c4d`: the model, the runtime and 8 hex digits of the digest, as
    a DNS-1123 label (at most 63 characters)."""
    stem = _NOT_DNS.sub("-", model.lower()).strip("-")[:40].strip("-") or "model"
    return f"{stem}-{option.runtime}-{option.digest.removeprefix('sha256:')[:8]}"


def _family(option: Option) -> str:
    return "vllm" if option.kind == "vllm" else "trtllm"


def choose(advice: Advice) -> list[Option]:
    """The primary and (when the ranking has another) the fallback (module doc)."""
    if not advice.ranked:
        return []
    primary = advice.ranked[0]
    others = advice.ranked[1:]
    fallback = next((o for o in others if _family(o) != _family(primary)), None)
    if fallback is None and others:
        fallback = others[0]
    return [primary] if fallback is None else [primary, fallback]


def limits(option: Option) -> tuple[int, int]:
    """(rpm, max_parallel_requests) of *option*'s replicas together (module doc)."""
    capacity, replicas = option.capacity.rate or 0.0, option.replicas or 1
    rpm = max(1, math.floor(capacity * replicas * 60))
    latency = option.capacity.latency_p50_s or 0.0
    return rpm, max(1, math.ceil(capacity * replicas * latency))


def route_manifest(advice: Advice, endpoints: Mapping[str, str] | None = None
                   ) -> RouteManifest:
    """The manifest for *advice*; *endpoints* maps a role (`primary`, `fallback`) or a
    variant name to the URL its OpenAI API answers at (default: `http://NAME:8000/v1`, its
    Service in the namespace). UsageError for an endpoint key that names no variant."""
    endpoints = dict(endpoints or {})
    variants = []
    for priority, option in enumerate(choose(advice)):
        name, role = variant_name(advice.model, option), ("primary", "fallback")[priority]
        url = endpoints.pop(role, None) or endpoints.pop(name, None) or \
            f"http://{name}:{PORT}/v1"
        rpm, parallel = limits(option)
        variants.append(Variant(name, role, priority, option, url, rpm, parallel))
    if endpoints:
        known = ", ".join(["primary", "fallback", *(v.name for v in variants)])
        raise UsageError(f"--endpoint {next(iter(endpoints))!r} names no variant of this "
                         f"route; known: {known}")
    return RouteManifest(advice.model, advice, tuple(variants))
