"""abgate: the nightly's promotion gate, a same-run A/B of the alias's incumbent and the
candidate that would replace it.

On this machine, in this run, the two are served in turn — incumbent, candidate, incumbent,
candidate … — *rounds* times each, one server at a time (two at once would split the GPU's
memory between them, the KV cache first, and measure that instead). Each round starts the
artifact's server from its manifest's argv (as `enginectl smoke REF` does, the files from the
store or the fetch cache), waits until it generates, runs one burst of the recipe's smoke load
at every concurrency level and stops it. A round's figure at a level is the median of its
requests' own tokens/s (pipeline.serving.loadgen); a side's figure is the median of its rounds', its
spread the range of its rounds' figures over that median.

The rule (`decide`, pure), per concurrency level: the candidate is no worse when its median is
at least (1 - max_regression) of the incumbent's. Below that, the shortfall (1 - candidate /
incumbent) is a regression only when it is also larger than the spread of either side: a
shortfall within the node's own noise in this run is a tie, and a tie goes to the candidate.
A level where the candidate's requests failed and the incumbent's did not is a regression.
Both sides slowed alike (a node or toolchain regression, pipeline.nightly.alarm's business)
is not the candidate's fault: it wins when it is no worse than the incumbent *now*.

When the incumbent cannot be served here (a TensorRT or TRT-LLM bump makes an old engine
unloadable, or it never became ready in the first round), the fallback decides: the candidate's
own smoke in this run passed, so it takes the alias (`rule` "fallback"), and the reason says
why the incumbent could not run. When this machine cannot serve the candidate (a Ray nightly
whose driver has no GPU), there is no A/B here: `run_gate` returns None and the caller keeps
its comparison with the last proofs on record (`rule` "history").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from pipeline.serving.loadgen import LoadLevel, median

if TYPE_CHECKING:
    from pipeline.serving.smoke_here import Served
    from pipeline.settings import Settings
    from registry.context import Context

Rule = Literal["ab", "fallback"]
SIDES: Final = ("incumbent", "candidate")


@dataclass(frozen=True, slots=True)
class GateLevel:
    """One concurrency level of the A/B: each side's median of its round figures, its spread
    (range over median), its median TTFT and errors, and the verdict."""

    concurrency: int
    rounds: int
    incumbent_tokens_per_s: float | None
    candidate_tokens_per_s: float | None
    incumbent_spread: float | None
    candidate_spread: float | None
    incumbent_ttft_s: float | None = None
    candidate_ttft_s: float | None = None
    incumbent_errors: int = 0
    candidate_errors: int = 0
    regressed: bool = False
    tie: bool = False  # below the threshold, but within the spread: the candidate's
    incumbent_best_tokens_per_s: float | None = None  # its fastest round (the alarm's figure)


@dataclass
class GateResult:
    """What the gate found: which rule decided, whether the candidate passed, the levels."""

    rule: Rule
    passed: bool
    reason: str
    levels: list[GateLevel] = field(default_factory=list)
    incumbent_error: str | None = None
    logs: list[str] = field(default_factory=list)


def figure(level: LoadLevel) -> float | None:
    """A round's figure: its median request tokens/s (its burst's tokens/s without it)."""
    if level.median_request_tokens_per_s is not None:
        return level.median_request_tokens_per_s
    return level.output_tokens_per_s if level.output_tokens else None


def _spread(values: Sequence[float]) -> float | None:
    middle = median(values)
    return None if middle is None or middle <= 0 else (max(values) - min(values)) / middle


def decide(incumbent: Sequence[Sequence[LoadLevel]], candidate: Sequence[Sequence[LoadLevel]],
           max_regression: float) -> GateResult:
    """The rule of the module doc over each side's rounds (each a list of load levels)."""
    levels: list[GateLevel] = []
    concurrencies = sorted({lv.concurrency for side in (incumbent, candidate)
                            for one in side for lv in one})
    for concurrency in concurrencies:
        sides = []
        for rounds in (incumbent, candidate):
            found = [lv for one in rounds for lv in one if lv.concurrency == concurrency]
            figures = [f for lv in found if (f := figure(lv)) is not None]
            ttfts = [lv.median_ttft_s for lv in found if lv.median_ttft_s is not None]
            sides.append((median(figures), _spread(figures), median(ttfts),
                          sum(lv.errors for lv in found), len(found), max(figures, default=None)))
        (old, old_spread, old_ttft, old_errors, count, old_best), (new, new_spread, new_ttft,
                                                                   new_errors, _, _) = sides
        regressed = tie = False
        if new_errors and not old_errors:
            regressed = True
        elif old is not None and new is not None and new < (1 - max_regression) * old:
            shortfall = 1 - new / old
            noise = max(old_spread or 0.0, new_spread or 0.0)
            tie = shortfall <= noise
            regressed = not tie
        elif old is not None and new is None:
            regressed = True
        levels.append(GateLevel(concurrency, count, old, new, old_spread, new_spread,
                                old_ttft, new_ttft, old_errors, new_errors, regressed, tie,
                                old_best))
    worst = next((lv for lv in levels if lv.regressed), None)
    if worst is None:
        ties = [lv.concurrency for lv in levels if lv.tie]
        reason = "no level slower than allowed in the same-run A/B" + (
            f" (concurrency {', '.join(map(str, ties))}: within the rounds' spread, a tie)"
            if ties else "")
        return GateResult("ab", True, reason, levels)
    if worst.candidate_errors and not worst.incumbent_errors:
        reason = (f"{worst.candidate_errors} of the candidate's requests failed at concurrency "
                  f"{worst.concurrency} in the A/B, none of the incumbent's")
    else:
        reason = (f"{worst.candidate_tokens_per_s or 0:.1f} tok/s at concurrency "
                  f"{worst.concurrency} is below {1 - max_regression:.0%} of the incumbent's "
                  f"{worst.incumbent_tokens_per_s or 0:.1f} tok/s in the same-run A/B "
                  f"(median of {worst.rounds} rounds each, beyond their spread)")
    return GateResult("ab", False, reason, levels)


def run_gate(ctx: Context, settings: Settings, incumbent: str, candidate: str, *, rounds: int,
             max_regression: float, log_dir: Path) -> GateResult | None:
    """Serve *incumbent* and *candidate* (digests of *ctx*'s registry) here in turn, *rounds*
    times each, and decide (module doc). None when this machine cannot serve the
    candidate."""
    from pipeline.errors import MachineError
    from pipeline.serving.server import NotReadyError
    from registry.errors import UsageError

    try:
        new, [old] = _prepared(ctx, settings, candidate, incumbent)
    except (MachineError, UsageError):
        return None
    measured: dict[str, list[list[LoadLevel]]] = {side: [] for side in SIDES}
    logs: list[str] = []
    if isinstance(old, str):
        return _fallback(old, logs)
    log_dir.mkdir(parents=True, exist_ok=True)
    for index in range(rounds):
        for side, served in zip(SIDES, (old, new), strict=True):
            log = log_dir / f"round{index + 1}-{side}.log"
            logs.append(str(log))
            try:
                measured[side].append(_round(served, log))
            except NotReadyError as exc:
                if side == "incumbent" and not measured[side]:
                    return _fallback(_why(exc.reason, exc.cause, exc.log_tail), logs)
                if side == "candidate":
                    return GateResult("ab", False, "the candidate did not serve in the A/B "
                                      f"round {index + 1}: {exc.reason} (log {log})",
                                      logs=logs)
    result = decide(measured["incumbent"], measured["candidate"], max_regression)
    result.logs = logs
    return result


def remeasure(ctx: Context, settings: Settings, digest: str, *, rounds: int,
              log_dir: Path) -> list[list[LoadLevel]] | None:
    """Serve *digest* (of *ctx*'s registry) here *rounds* times, one burst of its smoke load
    at each level a round (one side of the gate, alone: the toolchain regression alarm's
    confirmation). None when this machine cannot serve it, or a round never became ready."""
    from pipeline.errors import MachineError
    from pipeline.serving.server import NotReadyError
    from registry.errors import IntegrityError, NotFoundError, UsageError

    try:
        served, _ = _prepared(ctx, settings, digest)
    except (MachineError, UsageError, NotFoundError, IntegrityError):
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        return [_round(served, log_dir / f"round{index + 1}.log") for index in range(rounds)]
    except NotReadyError:
        return None


def _prepared(ctx: Context, settings: Settings, first: str,
              *others: str) -> tuple[Served, list[Served | str]]:
    """*first* and each of *others* ready to serve here (`prepare_served`). What *first*
    raises is raised; what one of *others* raises is its text in its place (an incumbent
    that cannot run here leaves the gate to its fallback)."""
    from pipeline.errors import MachineError
    from pipeline.serving.smoke_here import prepare_served
    from registry.errors import IntegrityError, NotFoundError, UsageError

    served = prepare_served(ctx, first, settings)
    rest: list[Served | str] = []
    for digest in others:
        try:
            rest.append(prepare_served(ctx, digest, settings))
        except (MachineError, UsageError, NotFoundError, IntegrityError) as exc:
            rest.append(str(exc))
    return served, rest


def _round(served: Served, log: Path) -> list[LoadLevel]:
    """One round: *served* started, one burst at each level, stopped."""
    from pipeline.serving.smoke import measure

    return measure(served.argv, model_dir=served.model_dir, served_name=served.served_name,
                   settings=served.settings, log_path=log, env=served.env)


def _why(reason: str, cause: str | None, log_tail: str) -> str:
    """*reason*, with the last line the server logged when no exception line names a cause."""
    if cause is not None:
        return reason
    lines = [line.strip() for line in log_tail.splitlines()
             if line.strip() and not line.startswith("enginectl:")]
    return f"{reason}; its log ends: {lines[-1][:300]}" if lines else reason


def _fallback(why: str, logs: list[str]) -> GateResult:
    return GateResult("fallback", True,
                      "the incumbent cannot run here, so the candidate's own smoke in this "
                      f"run decides, and it passed (the incumbent: {why})",
                      incumbent_error=why, logs=logs)


def levels_of(result: GateResult) -> list[Mapping[str, object]]:
    """The gate's levels as plain values (alias event details, reports)."""
    from dataclasses import asdict

    return [asdict(level) for level in result.levels]
