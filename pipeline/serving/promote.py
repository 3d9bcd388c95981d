"""promote: move a recipe's promotion aliases (`promote:` channels) to the artifacts a build
or a nightly made ready.

Two rules, one per caller:

- **build** (`promote_built`): a channel's alias moves to its target's artifact when that
  artifact is ready and the alias points nowhere or at a `superseded` artifact. Nothing is
  compared: a build fills an empty channel; it never replaces a live artifact, and never
  moves an alias a rollback pinned (`held_by_rollback`, which the nightly's gate asks first).
- **nightly** (`promote_gated`): the alias moves only when the new artifact is ready **and**
  it wins the same-run A/B against the artifact the alias points at now (pipeline.serving.abgate:
  both served here in turn, `nightly.gate_rounds` rounds each, the candidate's median
  request tokens/s at every level at least (1 - max_regression) of the incumbent's, a
  shortfall within the rounds' spread a tie the candidate wins). An incumbent that cannot run
  here leaves the candidate's own smoke to decide (`rule` "fallback"); a machine that cannot
  serve the candidate compares the last proofs on record instead (`rule` "history"). A loss
  holds the alias where it is. The move records the gate's numbers and rule in the alias
  event's details, and the replaced artifact becomes `superseded` once no alias points at
  it any more (kept; gc keeps the last `--keep-superseded` of each alias).

`Promotion.rule` says what decided: "ab", "fallback", "history", "empty" (the alias pointed
nowhere), "same-artifact" (re-proved), "rollback-pin" (held by a rollback) or "not-ready".

Every move and status change goes through `registry.ops.history` (store record, then SQL), so
`reindex` restores them. The comparisons themselves (`compare_levels`, `abgate.decide`) are
pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from pipeline.planning.channels import Channel
from pipeline.planning.plan import Plan
from pipeline.serving.abgate import GateLevel, run_gate
from pipeline.settings import Settings
from registry.context import Context
from registry.ops import history
from registry.sql import alias_records, records, smoke_records

if TYPE_CHECKING:  # a build's outcomes, read here; its result records the promotions
    from pipeline.planning.outcome import BuildSummary

Action = Literal["promoted", "held", "unchanged", "re-proved", "not-ready", "pending"]
"""`pending`: the gate let it through, and the caller moves it (`move_promotion`) or not."""


@dataclass(frozen=True, slots=True)
class LevelChange:
    """One concurrency level, old and new side by side (None: not measured there).

    *figure* names what the tokens/s are: "median_request_tokens_per_s" (robust, when both
    sides have it), else "output_tokens_per_s" (a burst's mean, old reports). From the A/B
    gate, old is the incumbent and new the candidate, each the median of *rounds* rounds
    with its *spread* (the rounds' range over their median)."""

    concurrency: int
    old_tokens_per_s: float | None
    new_tokens_per_s: float | None
    old_ttft_p50_s: float | None
    new_ttft_p50_s: float | None
    regressed: bool = False
    figure: str = "output_tokens_per_s"
    rounds: int | None = None
    old_spread: float | None = None
    new_spread: float | None = None
    old_best_tokens_per_s: float | None = None  # the incumbent's fastest round in the A/B

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "old_tokens_per_s": self.old_tokens_per_s,
                "new_tokens_per_s": self.new_tokens_per_s,
                "old_ttft_p50_s": self.old_ttft_p50_s, "new_ttft_p50_s": self.new_ttft_p50_s,
                "regressed": self.regressed, "figure": self.figure, "rounds": self.rounds,
                "old_spread": self.old_spread, "new_spread": self.new_spread,
                "old_best_tokens_per_s": self.old_best_tokens_per_s}


@dataclass
class Promotion:
    """What happened to one channel."""

    alias: str
    target: str
    action: Action
    old: str | None  # the digest the alias pointed at before
    new: str | None  # the target's artifact now
    max_regression: float
    levels: list[LevelChange] = field(default_factory=list)
    reason: str = ""
    rule: str = ""  # what decided (module doc)

    def as_dict(self) -> dict[str, Any]:
        return {"alias": self.alias, "target": self.target, "action": self.action,
                "old": self.old, "new": self.new, "max_regression": self.max_regression,
                "levels": [level.as_dict() for level in self.levels], "reason": self.reason,
                "rule": self.rule}


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


ROBUST: Final = "median_request_tokens_per_s"
MEAN: Final = "output_tokens_per_s"


def compare_levels(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                   max_regression: float | None) -> list[LevelChange]:
    """The load levels of two smoke reports side by side; a level where both measured and
    the new throughput is below (1 - *max_regression*) of the old is `regressed` (never,
    with *max_regression* None: a comparison to show, not a gate). The throughput compared
    is the median of per-request tokens/s where both reports have it (noise in a few
    requests moves it little), else each burst's tokens over its wall time (older
    reports); TTFT likewise prefers the median over the requests."""
    before, after = _levels(old), _levels(new)
    levels = []
    for concurrency in sorted(set(before) | set(after)):
        was, now = before.get(concurrency, {}), after.get(concurrency, {})
        robust = _number(was.get(ROBUST)) is not None and _number(now.get(ROBUST)) is not None
        figure = ROBUST if robust else MEAN
        old_tps, new_tps = _number(was.get(figure)), _number(now.get(figure))
        regressed = (max_regression is not None and old_tps is not None
                     and new_tps is not None and new_tps < (1 - max_regression) * old_tps)
        ttft = "median_ttft_s" if robust else "ttft_p50_s"
        levels.append(LevelChange(concurrency, old_tps, new_tps, _number(was.get(ttft)),
                                  _number(now.get(ttft)), regressed, figure))
    return levels


def latest_passing(reports: Iterable[smoke_records.SmokeRecord], *, key: str | None = None,
                   gpu: str | None = None) -> smoke_records.SmokeRecord | None:
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
    artifact; never one a rollback pinned (`registry.sql.alias_records.pinned_by_rollback`), never
    with a superseded artifact."""
    proven = _ready_entries(plan, summary)
    done: list[Promotion] = []
    for channel in plan.channels:
        new = proven.get(channel.smoke)
        if new is None or held_by_rollback(ctx, channel, new) is not None:
            continue
        with ctx.registry.session() as session:
            current = alias_records.get_alias(session, channel.alias)
            status = records.get_status(session, current) if current else None
            if current == new or (current is not None and status != "superseded") \
                    or alias_records.pinned_by_rollback(session, channel.alias) is not None:
                continue
            history.set_alias_and_record(ctx.store, session, channel.alias, new,
                                         f"promoted by build of {plan.loaded.recipe.display_name}",
                                         details={"recipe": plan.loaded.recipe.display_name,
                                       "target": channel.target, "rule": "build"})
        done.append(Promotion(channel.alias, channel.target, "promoted", current, new,
                              channel.max_regression,
                              reason="the alias pointed nowhere" if current is None
                              else "the alias pointed at a superseded artifact"))
    return done


def held_by_rollback(ctx: Context, channel: Channel, new: str | None) -> Promotion | None:
    """Why *channel*'s alias must not move to *new*, whatever a gate measures: *new* is the
    digest a rollback moved the alias away from (it stays pinned, `registry.ops.aliases`), or a
    `superseded` artifact (a re-smoke keeps it superseded; only `rollback` or a `tag` by
    hand brings one back). None when nothing forbids it."""
    if new is None:
        return None
    with ctx.registry.session(readonly=True) as session:
        current = alias_records.get_alias(session, channel.alias)
        pin = alias_records.pinned_by_rollback(session, channel.alias)
        status = records.get_status(session, new)
    if current == new:
        return None
    if pin is not None and new == pin.from_digest:
        reason = (f"{channel.alias} is {pin.describe()}; only a new digest that wins the "
                  "gate, or `enginectl tag`, moves it")
    elif status == "superseded":
        reason = (f"{new[:19]}… is superseded; only `enginectl rollback` or `enginectl "
                  "tag` points an alias at it again")
    else:
        return None
    return Promotion(channel.alias, channel.target, "held", current, new,
                     channel.max_regression, reason=reason)


def promote_gated(ctx: Context, settings: Settings, plan: Plan, summary: BuildSummary,
                  wanted: set[str] | None = None, *, move: bool = True) -> list[Promotion]:
    """The nightly rule (module doc) for the channels whose smoke run is in *wanted* (every
    channel when None), its A/B served with *settings* (the gate's logs in its work
    directory). Without *move*, a promotion the gate lets through comes back
    `pending`, its alias where it was, for the caller's `move_promotion`."""
    proven = _ready_entries(plan, summary)
    done: list[Promotion] = []
    for channel in plan.channels:
        if wanted is not None and channel.smoke not in wanted:
            continue
        made = _gate(ctx, settings, plan, channel, proven.get(channel.smoke))
        done.append(move_promotion(ctx, plan, made) if move and made.action == "pending"
                    else made)
    return done


def move_promotion(ctx: Context, plan: Plan, made: Promotion, *,
                   accepted: bool = False) -> Promotion:
    """Move the alias of `pending` *made* (`promote_gated` without `move`); *accepted*: the
    run accepted a toolchain regression of its pool, which the alias event's reason says."""
    channel = next(c for c in plan.channels
                   if c.alias == made.alias and c.target == made.target)
    if accepted:
        made.reason += "; the toolchain regression was accepted (--accept-regression)"
    return _move(ctx, plan, channel, made)


def _gate(ctx: Context, settings: Settings, plan: Plan, channel: Channel,
          new: str | None) -> Promotion:
    if (held := held_by_rollback(ctx, channel, new)) is not None:  # G4: keep first
        held.rule, held.levels = "rollback-pin", _kept_levels(ctx, plan, channel, held)
        return held
    gpu = plan.target(channel.target).gpu.sku
    made = Promotion(channel.alias, channel.target, "unchanged", None, new,
                     channel.max_regression)
    with ctx.registry.session() as session:
        current = made.old = alias_records.get_alias(session, channel.alias)
        if new is None:
            made.action, made.rule = "not-ready", "not-ready"
            made.reason = "its artifact is not ready (a stage or its smoke failed)"
            return made
        new_report = latest_passing(smoke_records.smoke_reports(session, new), key=channel.smoke)
        if current == new:  # same artifact, re-proved: compare with its previous proof
            old_report = latest_passing(
                [r for r in smoke_records.smoke_reports(session, new) if r.key != channel.smoke],
                gpu=gpu)
        else:
            old_report = None if current is None else \
                latest_passing(smoke_records.smoke_reports(session, current), gpu=gpu)
    history_levels = compare_levels(old_report.report if old_report else None,
                                    new_report.report if new_report else None,
                                    channel.max_regression)
    made.levels = history_levels
    if current == new:
        made.action, made.rule = "re-proved", "same-artifact"
        made.reason = "the same artifact, proven on the new toolchain"
        return made
    if current is None:
        made.rule, made.reason, made.action = "empty", "the alias pointed nowhere", "pending"
        return made
    return _by_gate(ctx, settings, plan, channel, made, compared=old_report is not None)


def _kept_levels(ctx: Context, plan: Plan, channel: Channel,
                 made: Promotion) -> list[LevelChange]:
    """The last proof on the channel's GPU of the artifact the alias keeps (*made*.old)
    against the candidate's proof: the numbers of a hold that nothing measured."""
    gpu = plan.target(channel.target).gpu.sku
    with ctx.registry.session(readonly=True) as session:
        kept = None if made.old is None else latest_passing(
            smoke_records.smoke_reports(session, made.old), gpu=gpu)
        new = None if made.new is None else latest_passing(
            smoke_records.smoke_reports(session, made.new), key=channel.smoke)
    return compare_levels(kept.report if kept else None, new.report if new else None, None)


def _by_gate(ctx: Context, settings: Settings, plan: Plan, channel: Channel, made: Promotion,
             *, compared: bool) -> Promotion:
    """The same-run A/B of *made*.old against *made*.new decides (`pipeline.serving.abgate`)."""
    current, new = made.old or "", made.new or ""
    log_dir = settings.work_dir / "gate" / channel.alias.replace("/", "_") / \
        new.removeprefix("sha256:")[:16]
    gate = run_gate(ctx, settings, current, new, rounds=_rounds(plan),
                    max_regression=channel.max_regression, log_dir=log_dir)
    if gate is None:  # this machine cannot serve the candidate: the proofs on record
        return _by_history(channel, made, compared=compared)
    made.rule, made.reason = gate.rule, gate.reason
    if gate.rule == "ab":
        made.levels = [_level(level) for level in gate.levels]
    made.action = "pending" if gate.passed else "held"
    return made


def _by_history(channel: Channel, made: Promotion, *, compared: bool) -> Promotion:
    """The decision without an A/B: *made*.levels (the last proofs on record) decide."""
    made.rule = "history"
    regressed = [level for level in made.levels if level.regressed]
    if regressed:
        worst = regressed[0]
        made.action = "held"
        made.reason = (f"{worst.new_tokens_per_s:.1f} tok/s at concurrency "
                       f"{worst.concurrency} is below {1 - channel.max_regression:.0%} of "
                       f"{worst.old_tokens_per_s:.1f} tok/s (its last proof; no A/B here: "
                       "this machine cannot serve it)")
        return made
    made.reason = ("no level slower than allowed against the last proofs on record (no A/B "
                   "here: this machine cannot serve it)" if compared else
                   "nothing to compare with")
    made.action = "pending"
    return made


def _rounds(plan: Plan) -> int:
    """The A/B's rounds per side: the recipe's `nightly.gate_rounds`."""
    return plan.loaded.recipe.nightly.gate_rounds


def _level(level: GateLevel) -> LevelChange:
    return LevelChange(level.concurrency, level.incumbent_tokens_per_s,
                       level.candidate_tokens_per_s, level.incumbent_ttft_s,
                       level.candidate_ttft_s, level.regressed, ROBUST, level.rounds,
                       level.incumbent_spread, level.candidate_spread,
                       level.incumbent_best_tokens_per_s)


def _move(ctx: Context, plan: Plan, channel: Channel, made: Promotion) -> Promotion:
    """Move the alias to *made*.new, record why, and supersede what it leaves."""
    current, new = made.old, made.new or ""
    details = {"recipe": plan.loaded.recipe.display_name, "target": channel.target,
               "rule": "nightly", "gate_rule": made.rule,
               "max_regression": channel.max_regression,
               "levels": [level.as_dict() for level in made.levels]}
    with ctx.registry.session() as session:
        history.set_alias_and_record(ctx.store, session, channel.alias, new,
                                     f"promoted by nightly ({made.rule}): {made.reason}",
                                     details=details)
        if current is not None and not alias_records.aliases_for(session, current) \
                and records.get_status(session, current) == "ready":
            history.set_status_and_record(ctx.store, session, current, "superseded",
                                          f"replaced by {new} as {channel.alias}")
    made.action = "promoted"
    return made
