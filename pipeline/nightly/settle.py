"""settle: the aliases a nightly's gate let through move once every recipe is judged, and
none of a pool whose toolchain regressed, unless the run accepts the regression
(`enginectl nightly --accept-regression`). A run that holds one is not settled: the next
nightly finds the same work (`registry.sql.nightly_runs.baseline`) and decides again.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.nightly.alarm import Regression
from pipeline.nightly.verdict import HELD_FOR_REGRESSION, TargetReport
from pipeline.planning.plan import Plan
from pipeline.serving.promote import Promotion, move_promotion
from registry.context import Context


def hold_for_regression(promotion: Promotion, found: Regression) -> None:
    """Hold *promotion* (its alias stays) because its pool's toolchain regressed (*found*,
    with both numbers); its levels stay the gate's."""
    promotion.action, promotion.rule = "held", HELD_FOR_REGRESSION
    promotion.reason = (f"toolchain regressed: {found}; `enginectl nightly "
                        "--accept-regression` promotes it")


def settle(ctx: Context, pending: Sequence[tuple[Plan, Promotion]],
           targets: Sequence[TargetReport], *, accept_regression: bool) -> None:
    """Move the aliases the gate let through (*pending*, the promotions whose action is
    `pending`), once every recipe is judged: none of a pool (GPU SKU) where any target
    regressed (`hold_for_regression`: held, its cause the regression, unless
    *accept_regression*)."""
    regressed: dict[str, Regression] = {}
    for target in targets:
        for regression in target.regressions:
            regressed.setdefault(regression.gpu, regression)
    for plan, promotion in pending:
        found = regressed.get(plan.target(promotion.target).gpu.sku)
        if found is not None and not accept_regression:
            hold_for_regression(promotion, found)
        else:
            move_promotion(ctx, plan, promotion, accepted=found is not None)
