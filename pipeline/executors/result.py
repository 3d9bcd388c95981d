"""What a build returns (`BuildResult`, local or on Ray), and the error of one that Ctrl-C
stopped (`raise_if_interrupted`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import BuildCancelledError
from pipeline.planning.keys import short_key
from pipeline.planning.outcome import BuildSummary

if TYPE_CHECKING:
    from pipeline.executors.groups import GroupedPlan, NodeProbe
    from pipeline.planning.plan import Plan
    from pipeline.planning.probe import Probe
    from pipeline.serving.promote import Promotion
    from registry.progress import Echo


@dataclass(frozen=True)
class BuildOptions:
    """How `build_recipe` runs: the `enginectl build` options of the same names."""

    jobs: int = 2  # stage runs at once on this machine
    only: str | None = None  # --only: the targets whose id matches this glob
    force: bool = False  # run every stage again, registry hits or not
    keep_going: bool = False  # one failing target never blocks the others
    dry_run: bool = False  # say hit or miss for every stage run; run nothing
    keep_work: bool = False  # published outputs stay in the work directory
    echo: Echo | None = None  # told one line per finished stage run
    live: bool | None = None  # a live table instead of *echo* (None: stdout is a terminal)
    run_on: str = "local"  # "ray": the stage runs on the Ray cluster at *address*
    address: str = "auto"
    promote: bool = True  # move the recipe's promote aliases (`promote.promote_built`)
    record_probes: bool | None = None  # None: unless a local dry run (a Ray one records)


@dataclass(frozen=True)
class RayPlanned:
    """How a build on Ray planned: each pool's node probes, the plan per group of nodes, the
    targets preflight skipped and the CPU nodes a CPU-only cluster runs on."""

    grouped: GroupedPlan
    probes: Mapping[str, list[NodeProbe]]
    reported: Mapping[str, Any]  # each pool's probe as the build reports it
    skipped: frozenset[str]
    cpu_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Planned:
    """What a build probed and how it planned the recipe. Handed to a later build of the
    same recipe (`build_recipe(..., planned=...)`), that build neither probes nor plans
    again: the nightly's dry run decides what to build, then its build runs that plan."""

    plan: Plan
    probe: Probe | None = None  # the local executor's probe of this machine
    on_ray: RayPlanned | None = None  # the Ray executor's


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
    planned: Planned | None = None
    """How it probed and planned, for a later build of the same recipe."""


def raise_if_interrupted(recipe: Path, summary: BuildSummary) -> None:
    """Ctrl-C stopped the walk: `BuildCancelledError` with what was kept and cancelled."""
    if summary.interrupted:
        stopped = [f"{o.stage} {short_key(o.key)} ({o.targets[0]})"
                   for o in summary.outcomes if o.status == "cancelled"]
        raise BuildCancelledError(recipe, len(summary.kept), stopped, summary=summary)
