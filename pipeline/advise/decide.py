"""What the proofs say a fleet should run for a rate and a latency objective. Pure, no I/O.

    advice = decide(model, proofs, fingerprints, slo=Slo(0.3, 0.05), rate=20.0, prices={})

For each servable artifact of the model and each GPU SKU it passed a smoke on, the proof is
the one `registry.ops.resolve` would rank it by: the latest passing report at the nearest match
to the pool's current fingerprint (`registry.sql.evidence.nearest`), and only one on that very
fingerprint counts as proven. From a proven artifact's capacity curve
(`pipeline.serving.capacity.capacity_at`): its capacity at the objective, the replicas the rate
needs (ceil(rate ÷ capacity)), the GPUs (replicas × tp × pp), $/hour (GPUs × the price of one
GPU-hour; on the CPU, replicas × the price of one machine-hour) and $ per 1M output tokens
($/hour ÷ (rate × tokens per request × 3600) × 10⁶). Rows that meet the objective are ranked by
$/hour (those without a price after, by GPUs), then by capacity, then in resolve's kind
order; the others are listed apart:
`short` (proven, but even the lowest measured rate misses the objective, with by how much) and
`unproven` (no proof on the current fingerprint, no curve, not ready; each with its reason).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pipeline.serving.capacity import Capacity, Slo, capacity_at, curve_from_dict
from registry.sql.curve_records import CurveProof
from registry.sql.evidence import Proof, nearest

RUNTIME_OF: Final = {"trtllm-engine": "trtllm", "trtllm-checkpoint": "trtllm-pytorch",
                     "vllm": "vllm"}


@dataclass(frozen=True, slots=True)
class Option:
    """One proven artifact on one GPU SKU, read at the objective."""

    digest: str
    kind: str
    gpu: str
    quant: str | None
    tp: int
    pp: int
    proof_at: str  # ISO time of the proof
    fingerprint: Mapping[str, Any]
    capacity: Capacity
    replicas: int | None
    gpus: int | None
    price_per_gpu_hour: float | None
    cost_per_hour: float | None
    cost_per_million_tokens: float | None

    @property
    def runtime(self) -> str:
        return RUNTIME_OF[self.kind]

    @property
    def meets(self) -> bool:
        return self.capacity.rate is not None

    def as_dict(self) -> dict[str, Any]:
        cap = self.capacity
        return {
            "digest": self.digest, "kind": self.kind, "runtime": self.runtime, "gpu": self.gpu,
            "quant": self.quant, "tp": self.tp, "pp": self.pp,
            "proof": {"digest": self.digest, "at": self.proof_at, "gpu": self.gpu,
                      "fingerprint": dict(self.fingerprint)},
            "capacity_rps": cap.rate, "capacity_is_lower_bound": cap.measured_limit,
            "at_capacity": {"ttft_p95_s": cap.ttft_p95_s, "tpot_p95_s": cap.tpot_p95_s,
                            "latency_p50_s": cap.latency_p50_s,
                            "output_tokens_per_request": cap.tokens_per_request,
                            "rounds": cap.rounds},
            "missed": list(cap.missed), "lowest_rate": cap.lowest_rate,
            "replicas": self.replicas, "gpus": self.gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour, "cost_per_hour": self.cost_per_hour,
            "cost_per_million_tokens": self.cost_per_million_tokens,
        }


@dataclass(frozen=True, slots=True)
class Unproven:
    digest: str
    kind: str
    gpu: str | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "kind": self.kind, "gpu": self.gpu,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Advice:
    model: str
    slo: Slo
    rate: float
    ranked: tuple[Option, ...]  # meet the objective, cheapest first
    short: tuple[Option, ...]  # proven, but miss the objective even at their lowest rate
    unproven: tuple[Unproven, ...]

    @property
    def nearest(self) -> Option | None:
        """Of `short`, the one that misses by least (its lowest-rate TTFT p95 nearest)."""
        return min(self.short, key=_shortfall, default=None)

    def as_dict(self) -> dict[str, Any]:
        near = self.nearest
        return {"model": self.model, "slo": self.slo.as_dict(), "rate": self.rate,
                "ranked": [o.as_dict() for o in self.ranked],
                "short": [o.as_dict() for o in self.short],
                "nearest": None if near is None else {"digest": near.digest,
                                                      "gpu": near.gpu,
                                                      "missed": list(near.capacity.missed)},
                "unproven": [u.as_dict() for u in self.unproven]}


def _shortfall(option: Option) -> float:
    """How far over the objective *option*'s figures at its lowest rate are, relatively."""
    found = option.capacity.shortfall
    return math.inf if found is None else found


def plan_replicas(rate: float, capacity: float) -> int:
    """The replicas that serve *rate* when one sustains *capacity*: ceil(rate ÷ capacity),
    at least one."""
    return max(1, math.ceil(rate / capacity - 1e-9))


def costs(*, rate: float, replicas: int, units: int, price: float | None,
          tokens_per_request: float | None) -> tuple[float | None, float | None]:
    """($/hour, $ per 1M output tokens) of *replicas* of *units* GPUs (or machines) each at
    *price* per unit-hour serving *rate* requests/s of *tokens_per_request* output tokens."""
    if price is None:
        return None, None
    per_hour = replicas * units * price
    if not tokens_per_request or rate <= 0:
        return per_hour, None
    return per_hour, per_hour / (rate * tokens_per_request * 3600) * 1e6


def decide(
    model: str, proofs: Iterable[CurveProof], fingerprints: Mapping[str, Mapping[str, Any]],
    *, slo: Slo, rate: float, prices: Mapping[str, float], gpu: str | None = None,
) -> Advice:
    """The advice (module doc). *fingerprints*: each SKU's current pool fingerprint (a SKU
    absent: its latest proof counts as current); *prices*: $ per GPU-hour by SKU, over the
    price each proof recorded; *gpu*: only this SKU."""
    by_artifact: dict[tuple[str, str], list[CurveProof]] = {}
    statuses: dict[str, CurveProof] = {}
    for proof in proofs:
        statuses[proof.digest] = proof
        if gpu is None or proof.gpu == gpu:
            by_artifact.setdefault((proof.digest, proof.gpu), []).append(proof)
    options: list[Option] = []
    unproven: list[Unproven] = []
    for (digest, on), found in sorted(by_artifact.items()):
        last = found[-1]
        if last.status != "ready":
            unproven.append(Unproven(digest, last.kind, on, f"not ready (status {last.status})"))
            continue
        used = nearest([_as_proof(p) for p in found], last.kind, fingerprints.get(on, {}))
        if used.match != "fingerprint" or used.proof is None:
            unproven.append(Unproven(digest, last.kind, on, (
                f"no proof on the current fingerprint of {on} "
                f"({', '.join(used.differs) or 'none'})")))
            continue
        chosen = next(p for p in reversed(found) if p.at == used.proof.at)
        curve = curve_from_dict(chosen.curve)
        if curve is None or not curve.points:
            unproven.append(Unproven(digest, last.kind, on, (
                "its proof has no capacity curve (set smoke.capacity in the recipe, then "
                f"`enginectl smoke {digest}`)")))
            continue
        options.append(_option(chosen, capacity_at(curve, slo), rate=rate,
                               price=prices.get(on, chosen.price_per_hour)))
    seen = {digest for digest, _ in by_artifact}
    unproven += [Unproven(d, p.kind, None, "no passing smoke on " + (gpu or "any GPU"))
                 for d, p in sorted(statuses.items()) if d not in seen]
    meets = sorted((o for o in options if o.meets), key=_rank)
    short = tuple(o for o in options if not o.meets)
    return Advice(model, slo, rate, tuple(meets), short, tuple(unproven))


def _as_proof(proof: CurveProof) -> Proof:
    return Proof(proof.digest, proof.gpu, proof.at, proof.tokens_per_s, proof.toolchain)


def _option(proof: CurveProof, capacity: Capacity, *, rate: float, price: float | None
            ) -> Option:
    units = proof.tp * proof.pp
    replicas = gpus = None
    per_hour = per_million = None
    if capacity.rate is not None and capacity.rate > 0:
        replicas = plan_replicas(rate, capacity.rate)
        gpus = 0 if proof.gpu == "CPU" else replicas * units
        per_hour, per_million = costs(
            rate=rate, replicas=replicas, units=1 if proof.gpu == "CPU" else units,
            price=price, tokens_per_request=capacity.tokens_per_request)
    fingerprint = {name: value for name, value in proof.toolchain.items() if value}
    return Option(proof.digest, proof.kind, proof.gpu, proof.quant, proof.tp, proof.pp,
                  proof.at.isoformat(), fingerprint, capacity, replicas, gpus, price,
                  per_hour, per_million)


def _rank(option: Option) -> tuple[int, float, float, int, str]:
    """Cheapest first (priced before unpriced, those by GPUs), then the larger capacity,
    then resolve's kind order (engines, checkpoints, vLLM), then the digest."""
    cost = option.cost_per_hour
    return (0 if cost is not None else 1,
            cost if cost is not None else float(option.gpus or 0),
            -(option.capacity.rate or 0.0), list(RUNTIME_OF).index(option.kind),
            option.digest)
