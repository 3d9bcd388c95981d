"""`enginectl advise` as text: the ranking, what falls short of the objective and by how
much, and what is unproven. Pure."""

from __future__ import annotations

from pipeline.advise.decide import Advice, Option
from pipeline.serving.capacity import Slo


def objective(slo: Slo, rate: float) -> str:
    """`20 requests/s within TTFT p95 300 ms and TPOT p95 50 ms`"""
    text = f"{rate:g} requests/s within TTFT p95 {slo.ttft_p95_s * 1000:g} ms"
    if slo.tpot_p95_s is not None:
        text += f" and TPOT p95 {slo.tpot_p95_s * 1000:g} ms"
    return text


def _money(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(rank: int, option: Option) -> list[str]:
    cap = option.capacity
    bound = "≥" if cap.measured_limit else ""
    versions = ", ".join(f"{k} {v}" for k, v in option.fingerprint.items()
                         if k in ("driver", "trtllm", "vllm"))
    return [str(rank), option.digest[:19] + "…", option.kind, option.gpu,
            f"{option.tp}x{option.pp}" if option.pp > 1 else str(option.tp),
            f"{bound}{cap.rate:.2f}/s" if cap.rate is not None else "-",
            str(option.replicas or "-"), str(option.gpus if option.gpus is not None else "-"),
            _money(option.cost_per_hour), _money(option.cost_per_million_tokens),
            f"{option.proof_at[:19]}" + (f" ({versions})" if versions else "")]


def advice_lines(advice: Advice) -> list[str]:
    lines = [f"advise {advice.model}: {objective(advice.slo, advice.rate)}"]
    if advice.ranked:
        header = ["#", "digest", "kind", "gpu", "tp", "capacity", "replicas", "gpus",
                  "$/hour", "$/1M out", "proof"]
        rows = [header] + [_row(i, o) for i, o in enumerate(advice.ranked, 1)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))
                  + "  " + r[-1] for r in rows]
        if any(o.capacity.measured_limit for o in advice.ranked):
            lines.append("  ≥: the objective held at every rate measured; the capacity is "
                         "the highest rate measured, not extrapolated")
    else:
        near = advice.nearest
        lines.append("  nothing proven meets it" + (
            f"; nearest: {near.digest[:19]}… {near.kind} on {near.gpu} at "
            f"{near.capacity.lowest_rate:g} requests/s: {'; '.join(near.capacity.missed)}"
            if near is not None else ""))
    if advice.short:
        lines.append("short of the objective even at the lowest rate measured:")
        lines += [f"  {o.digest[:19]}… {o.kind} on {o.gpu} at {o.capacity.lowest_rate:g}"
                  f" requests/s: {'; '.join(o.capacity.missed)}" for o in advice.short]
    if advice.unproven:
        lines.append("unproven (not ranked):")
        lines += [f"  {u.digest[:19]}… {u.kind}" + (f" on {u.gpu}" if u.gpu else "")
                  + f": {u.reason}" for u in advice.unproven]
    return lines
