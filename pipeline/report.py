"""Human-readable output of plans. The JSON forms live with their types."""

from __future__ import annotations

from collections import Counter

import click

from pipeline.keys import short_key
from pipeline.memory import GIB
from pipeline.plan import Plan

STAGE_ORDER = ("snapshot", "quantize", "convert", "build", "smoke")


def plan_lines(plan: Plan, built: frozenset[str] = frozenset()) -> list[str]:
    """One block per target: its memory fit, then each stage with its short key and whether
    it is new, shared with other targets, or already built."""
    recipe = plan.loaded.recipe
    revision = f"@{recipe.model.revision[:12]}" if recipe.model.revision else ""
    title = click.style(recipe.display_name, bold=True)
    lines = [f"{title}: {recipe.model.name} from {recipe.model.source}{revision}"]
    for planned in plan.targets:
        target, fit, shape = planned.target, planned.fit, planned.target.shape
        tokens = f", tokens {shape.max_num_tokens}" if shape.max_num_tokens else ""
        shape_line = (
            f"  shape {shape.label}: batch {shape.max_batch_size}, input {shape.max_input_len}, "
            f"seq {shape.max_seq_len}{tokens}"
        )
        memory_line = (
            f"  memory: fits, {fit.needed_bytes / GIB:.1f} of {fit.capacity_bytes / GIB:.1f} GiB "
            f"per rank (weights {fit.weights_bytes / GIB:.1f}, KV {fit.kv_bytes / GIB:.1f}, "
            f"margin {fit.margin_bytes / GIB:.1f}); largest batch at this length "
            f"{fit.max_batch_size}"
        )
        lines += ["", f"{click.style(target.id, bold=True)}  (SM {target.gpu.sm})", shape_line,
                  memory_line]
        for key in planned.chain:
            run = plan.stages[key]
            users = len(run.targets)
            if key in built:
                status = "built"
            else:
                status = f"shared by {users} targets" if users > 1 else "new"
            lines.append(f"  {run.stage:<9} {short_key(key)}  {run.kind:<21} {status}")
    counts = Counter(run.stage for run in plan.stages.values())
    parts = ", ".join(f"{counts[s]} {s}" for s in STAGE_ORDER if counts[s])
    toolchain = ", ".join(f"{k} {v}" for k, v in plan.toolchain.as_dict().items() if v)
    lines += [
        "",
        f"{len(plan.targets)} targets, {len(plan.stages)} stage runs ({parts}).",
        f"toolchain: {toolchain}",
    ]
    return lines


def print_plan(plan: Plan) -> None:
    click.echo("\n".join(plan_lines(plan)))
