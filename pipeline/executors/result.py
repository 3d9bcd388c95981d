"""What a build returns (`BuildResult`, local or on Ray), and the error of one that Ctrl-C
stopped (`raise_if_interrupted`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import BuildCancelledError
from pipeline.planning.keys import short_key
from pipeline.planning.outcome import BuildSummary

if TYPE_CHECKING:
    from pipeline.planning.plan import Plan
    from pipeline.serving.promote import Promotion


@dataclass
class BuildResult:
    plan: Plan
    hits: set[str]
    summary: BuildSummary = field(default_factory=BuildSummary)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What each pool's toolchain probe found (pool -> fingerprint), recorded or not."""
    promotions: list[Promotion] = field(default_factory=list)
    """The recipe's `promote` aliases this build moved
    (`pipeline.serving.promote.promote_built`)."""


def raise_if_interrupted(recipe: Path, summary: BuildSummary) -> None:
    """Ctrl-C stopped the walk: `BuildCancelledError` with what was kept and cancelled."""
    if summary.interrupted:
        stopped = [f"{o.stage} {short_key(o.key)} ({o.targets[0]})"
                   for o in summary.outcomes if o.status == "cancelled"]
        raise BuildCancelledError(recipe, len(summary.kept), stopped, summary=summary)
