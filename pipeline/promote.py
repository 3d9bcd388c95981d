"""promote: move a recipe's promotion aliases (`promote:` channels) to the artifacts a build
or a nightly made ready.

Two rules, one per caller:

- **build** (`promote_built`): a channel's alias moves to its target's artifact when that
  artifact is ready and the alias points nowhere or at a `superseded` artifact. Nothing is
  compared: a build fills an empty channel; it never replaces a live artifact.
- **nightly** (`promote_gated`): the alias moves only when the new artifact is ready **and**
  its smoke throughput at every concurrency level both reports measured is at least
  (1 - max_regression) of the artifact the alias points at now. A regression holds the
  alias where it is. The move records both numbers in the alias event's details, and the
  replaced artifact becomes `superseded` once no alias points at it any more (kept; gc
  keeps the last `--keep-superseded` of each alias).

Every move and status change goes through `registry.history` (store record, then SQL), so
`reindex` restores them. The comparison itself (`compare_levels`) is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.channels import Channel
from pipeline.executors.outcome import BuildSummary
from pipeline.plan import Plan
from registry import history, records
from registry.context import Context

Action = Literal["promoted", "held", "unchanged", "re-proved", "not-ready"]


@dataclass(frozen=True, slots=True)
class Level:
    """One concurrency level, old and new side by side (None: not measured there)."""

    concurrency: int
    old_tokens_per_s: float | None
    new_tokens_per_s: float | None
    old_ttft_p50_s: float | None
    new_ttft_p50_s: float | None
    regressed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "old_tokens_per_s": self.old_tokens_per_s,
                "new_tokens_per_s": self.new_tokens_per_s,
                "old_ttft_p50_s": self.old_ttft_p50_s, "new_ttft_p50_s": self.new_ttft_p50_s,
                "regressed": self.regressed}


@dataclass
class Promotion:
    """What happened to one channel."""

    alias: str
    target: str
    action: Action
    old: str | None  # the digest the alias pointed at before
    new: str | None  # the target's artifact now
    max_regression: float
    levels: list[Level] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"alias": self.alias, "target": self.target, "action": self.action,
                "old": self.old, "new": self.new, "max_regression": self.max_regression,
                "levels": [level.as_dict() for level in self.levels], "reason": self.reason}


def _levels(report: Mapping[str, Any] | None) -> dict[int, Mapping[str, Any]]:
    if report is None:
        return {}
    found: dict[int, Mapping[str, Any]] = {}
    for level in report.get("load") or []:
        if isinstance(level, Mapping) and isinstance(level.get("concurrency"), int):
            found[level["concurrency"]] = level
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def compare_levels(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                   max_regression: float | None) -> list[Level]:
    """The load levels of two smoke reports side by side; a level where both measured and
    the new throughput is below (1 - *max_regression*) of the old is `regressed` (never,
    with *max_regression* None: a comparison to show, not a gate)."""
    before, after = _levels(old), _levels(new)
    levels = []
    for concurrency in sorted(set(before) | set(after)):
        old_tps = _number(before.get(concurrency, {}).get("output_tokens_per_s"))
        new_tps = _number(after.get(concurrency, {}).get("output_tokens_per_s"))
        regressed = (max_regression is not None and old_tps is not None
                     and new_tps is not None and new_tps < (1 - max_regression) * old_tps)
        levels.append(Level(
            concurrency, old_tps, new_tps,
            _number(before.get(concurrency, {}).get("ttft_p50_s")),
            _number(after.get(concurrency, {}).get("ttft_p50_s")), regressed))
    return levels


def latest_passing(reports: Iterable[records.SmokeReport], *, key: str | None = None,
                   gpu: str | None = None) -> records.SmokeReport | None:
    """The newest passing report (of smoke run *key*, measured on *gpu*, when given)."""
    found = None
    for report in reports:
        if report.passed and (key is None or report.key == key) \
                and (gpu is None or report.gpu in (gpu, None)):
            found = report
    return found


def _ready_entries(plan: Plan, summary: BuildSummary) -> dict[str, str]:
    """Smoke key -> the entry digest its smoke run proved ready in this build."""
    return {o.key: o.digest for o in summary.outcomes
            if o.stage == "smoke" and o.status in ("built", "reused") and o.digest
            and o.key in plan.stages}


def promote_built(ctx: Context, plan: Plan, summary: BuildSummary) -> list[Promotion]:
    """The build rule (module doc): fill channels that point nowhere or at a superseded
    artifact."""
    proven = _ready_entries(plan, summary)
    done: list[Promotion] = []
    for channel in plan.channels:
        new = proven.get(channel.smoke)
        if new is None:
            continue
        with ctx.registry.session() as session:
            current = records.get_alias(session, channel.alias)
            status = records.get_status(session, current) if current else None
            if current == new or (current is not None and status != "superseded"):
                continue
            history.set_alias(ctx.store, session, channel.alias, new,
                              f"promoted by build of {plan.loaded.recipe.display_name}",
                              details={"recipe": plan.loaded.recipe.display_name,
                                       "target": channel.target, "rule": "build"})
        done.append(Promotion(channel.alias, channel.target, "promoted", current, new,
                              channel.max_regression,
                              reason="the alias pointed nowhere" if current is None
                              else "the alias pointed at a superseded artifact"))
    return done


def promote_gated(ctx: Context, plan: Plan, summary: BuildSummary,
                  wanted: set[str] | None = None) -> list[Promotion]:
    """The nightly rule (module doc) for the channels whose smoke run is in *wanted* (every
    channel when None)."""
    proven = _ready_entries(plan, summary)
    done: list[Promotion] = []
    for channel in plan.channels:
        if wanted is not None and channel.smoke not in wanted:
            continue
        done.append(_gate(ctx, plan, channel, proven.get(channel.smoke)))
    return done


def _gate(ctx: Context, plan: Plan, channel: Channel, new: str | None) -> Promotion:
    gpu = plan.target(channel.target).gpu.sku
    with ctx.registry.session() as session:
        current = records.get_alias(session, channel.alias)
        if new is None:
            return Promotion(channel.alias, channel.target, "not-ready", current, None,
                             channel.max_regression,
                             reason="its artifact is not ready (a stage or its smoke failed)")
        new_report = latest_passing(records.smoke_reports(session, new), key=channel.smoke)
        if current is None:
            old_report = None
        elif current == new:  # same artifact, re-proved: compare with its previous proof
            old_report = latest_passing(
                [r for r in records.smoke_reports(session, new) if r.key != channel.smoke],
                gpu=gpu)
        else:
            old_report = latest_passing(records.smoke_reports(session, current), gpu=gpu)
        levels = compare_levels(old_report.report if old_report else None,
                                new_report.report if new_report else None,
                                channel.max_regression)
        made = Promotion(channel.alias, channel.target, "unchanged", current, new,
                         channel.max_regression, levels)
        if current == new:
            made.action = "re-proved"
            made.reason = "the same artifact, proven on the new toolchain"
            return made
        regressed = [level for level in levels if level.regressed]
        if regressed:
            worst = regressed[0]
            made.action = "held"
            made.reason = (f"{worst.new_tokens_per_s:.1f} tok/s at concurrency "
                           f"{worst.concurrency} is below {1 - channel.max_regression:.0%} of "
                           f"{worst.old_tokens_per_s:.1f} tok/s")
            return made
        details = {"recipe": plan.loaded.recipe.display_name, "target": channel.target,
                   "rule": "nightly", "max_regression": channel.max_regression,
                   "levels": [level.as_dict() for level in levels]}
        history.set_alias(ctx.store, session, channel.alias, new,
                          "promoted by nightly: no slower than the artifact it replaces",
                          details=details)
        if current is not None and not records.aliases_for(session, current) \
                and records.get_status(session, current) == "ready":
            history.set_status(ctx.store, session, current, "superseded",
                               f"replaced by {new} as {channel.alias}")
        made.action = "promoted"
        made.reason = "no level slower than allowed" if old_report else \
            "nothing to compare with" if current is not None else "the alias pointed nowhere"
        return made
