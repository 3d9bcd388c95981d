"""Human-readable output of plans (`enginectl plan`, `build --dry-run`) and of the registry's
listings (`ls`, `show`, `resolve`). The JSON forms live with their types.

Pure text, no I/O and no click (only pipeline.cli imports click; it prints these lines with
`click.echo`, which drops the bold's escape codes when stdout is not a terminal). Top level
because both the CLI and executors.view (the build's own lines) use it. The plan's modules
(and through them the recipe's pydantic models) are imported by `plan_lines` alone: `ls`,
`show` and `resolve` print without them.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.planning.plan import Plan

STAGE_ORDER = ("snapshot", "quantize", "convert", "build", "smoke")


def _bold(text: str) -> str:
    """*text* in bold on a terminal: the escape codes `click.style(text, bold=True)` makes."""
    return f"\x1b[1m{text}\x1b[0m"


def plan_lines(plan: Plan, built: frozenset[str] = frozenset(),
               toolchain_source: str | None = None) -> list[str]:
    """One block per target: its memory fit, then each stage with its short key and whether
    it is new, shared with other targets, or already built."""
    from pipeline.planning.keys import short_key
    from pipeline.planning.memory import GIB
    from pipeline.stages.build import plugin_overrides

    recipe = plan.loaded.recipe
    revision = f"@{recipe.model.revision[:12]}" if recipe.model.revision else ""
    title = _bold(recipe.display_name)
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
        lines += ["", f"{_bold(target.id)}  (SM {target.gpu.sm})", shape_line,
                  memory_line]
        if target.runtime == "trtllm":  # what trtllm-build changes, so the plan says it
            _, overrides = plugin_overrides(recipe.build, target.quant, target.kv_cache_dtype,
                                            tp=target.tp, family=plan.source.architecture.family)
            lines += [f"  TRT-LLM builds {override}" for override in overrides]
        for key in planned.chain:
            run = plan.stages[key]
            users = len(run.targets)
            if key in built:
                status = "built"
            else:
                status = f"shared by {users} targets" if users > 1 else "new"
            lines.append(f"  {run.stage:<9} {short_key(key)}  {run.kind:<21} {status}")
        lines += [f"  promotes {c.alias} (max regression {c.max_regression:.0%})"
                  for c in plan.channels if c.target == target.id]
    counts = Counter(run.stage for run in plan.stages.values())
    parts = ", ".join(f"{counts[s]} {s}" for s in STAGE_ORDER if counts[s])
    toolchain = ", ".join(f"{k} {v}" for k, v in plan.toolchain.as_dict().items() if v)
    lines += [
        "",
        f"{len(plan.targets)} targets, {len(plan.stages)} stage runs ({parts}).",
        f"toolchain: {toolchain}" + (f" ({toolchain_source})" if toolchain_source else ""),
    ]
    return lines


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    return str(nbytes)


def artifact_table(rows: list[dict[str, Any]]) -> str:
    """`enginectl ls`: one line per artifact, status reason included."""
    if not rows:
        return "no artifacts match"
    header = ("DIGEST", "KIND", "MODEL", "GPU", "QUANT", "TP", "SEQ", "SIZE", "PROVEN ON",
              "STATUS", "ALIASES")
    lines = [header]
    for row in rows:
        status = row["status"] + (f" ({row['status_reason']})" if row.get("status_reason") else "")
        proven = ",".join(e["gpu"] for e in row.get("evidence") or []) or "-"
        lines.append((
            row["digest"][7:19], row["kind"], row["model"], row.get("gpu") or "-",
            row.get("quant") or "-", str(row.get("tp") or 1), str(row.get("max_seq_len") or "-"),
            _size(row["size"]), proven, status, ",".join(row.get("aliases") or []) or "-",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  " + line[-1]
        for line in lines
    )


def show_lines(info: dict[str, Any]) -> list[str]:
    """`enginectl show`: the artifact, its files, aliases, smoke reports and provenance."""
    artifact, manifest = info["artifact"], info["manifest"]
    lines = [
        f"{artifact['digest']}",
        (f"  kind      {artifact['kind']}   status {artifact['status']}"
         + (f" ({artifact['status_reason']})" if artifact.get("status_reason") else "")),
        (f"  model     {artifact['model']}   gpu {artifact.get('gpu') or '-'}   "
         f"quant {artifact.get('quant') or '-'}   tp {artifact['tp']} pp {artifact['pp']}"),
        f"  key       {artifact.get('key') or '-'}",
        f"  created   {artifact.get('created_at')}",
        f"  aliases   {', '.join(artifact['aliases']) or '-'}",
        *(f"  pinned    {pin['alias']} by a rollback at {pin['at']} from {pin['from']}"
          + (f": {pin['note']}" if pin.get("note") else " (no --note given)")
          for pin in info.get("pins") or ()),
        f"  toolchain {json.dumps(manifest['toolchain'], sort_keys=True)}",
        f"  files     {len(manifest['files'])} ({_size(artifact['size'])})",
    ]
    lines += [f"    {f['path']}  {_size(f['size'])}  {f['xxh3']}" for f in manifest["files"]]
    if manifest.get("serve"):
        lines.append(f"  serve     {' '.join(manifest['serve'].get('argv', []))}")
    for report in info["smoke_reports"]:
        verdict = "passed" if report["passed"] else "FAILED"
        lines.append(f"  smoke     {verdict} at {report['created_at']} on "
                     f"{report.get('gpu') or 'an unknown GPU (before schema 0003)'}"
                     + _versions(report.get("toolchain")))
        if (curve := curve_line((report.get("report") or {}).get("capacity"))) is not None:
            lines.append(f"    curve   {curve}")
    for warm in info.get("warm_caches") or ():
        lines.append(f"  warm      {warm['digest']} ({_size(warm['size'])}) captured on "
                     f"{warm.get('gpu') or '-'}" + _versions(warm.get("toolchain")))
    if refit := info.get("refit_equivalence"):
        lines.append(f"  refit     weight-stripped: refitted from {refit['refit_source']}")
        lines.append("  refit-equivalence " + (
            f"{refit['evidence']} holds" if refit["holds"] else str(refit["held_back"])))
    run = info.get("stage_run")
    if run:
        node = f" (Ray node {run['node_id']})" if run.get("node_id") else ""
        lines.append(f"  built     on {run['host']}{node} from {run['started_at']} to "
                     f"{run['finished_at']}; log blob {run['log'] or '-'}")
        lines.append(f"  recipe    {run['recipe_digest'] or '-'}")
    lines.append("  provenance")
    lines += _tree(info["provenance"], "    ") or ["    (no inputs: a source or an import)"]
    return lines


def curve_line(value: object) -> str | None:
    """`1/s 50/12 ms · 2/s 80/14 ms … (TTFT/TPOT p95; stopped: ttft)`: a report's capacity
    curve on one line (None when it has none); measured in rounds, each rate's median round,
    and `[2 of 3]` after a rate that only some rounds reached."""
    from pipeline.serving.capacity import curve_from_dict

    found = curve_from_dict(value)
    if found is None:
        return None

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f}"

    points = " · ".join(f"{p.rate:g}/s {ms(p.ttft_p95_s)}/{ms(p.tpot_p95_s)} ms"
                        + (f" ({p.errors} errors)" if p.errors else "")
                        + (f" [{len(p.samples)} of {found.rounds}]"
                           if len(p.samples) < found.rounds else "") for p in found.points)
    rounds = f", the median of {found.rounds} rounds" if found.rounds > 1 else ""
    return f"{points} (TTFT/TPOT p95{rounds}; stopped: {found.stopped})"


def _versions(toolchain: dict[str, Any] | None) -> str:
    """` (driver 570.124.06, vllm 0.32.0)`: what a smoke report's toolchain says, briefly."""
    if not toolchain:
        return ""
    parts = [f"{name} {toolchain[name]}" for name in ("driver", "cuda", "tensorrt", "trtllm",
                                                       "vllm") if toolchain.get(name)]
    return f" ({', '.join(parts)})" if parts else ""


def _tree(nodes: list[dict[str, Any]], indent: str) -> list[str]:
    lines = []
    for node in nodes:
        lines.append(f"{indent}{node['digest'][:19]}…  {node.get('kind') or 'not registered'}")
        lines += _tree(node.get("inputs") or [], indent + "  ")
    return lines


def resolve_lines(ranked: Any, explain: bool) -> list[str]:
    """`enginectl resolve`: the ranked candidates (throughput measured on the node's GPU
    only), and with --explain every rejection and every candidate unproven there."""
    lines = []
    for index, candidate in enumerate(ranked.candidates, start=1):
        speed = f"{candidate.tokens_per_s:.0f} tok/s" if candidate.tokens_per_s else "unmeasured"
        note = candidate.unproven_note(ranked.gpu) if ranked.gpu else None
        lines.append(
            f"{index}. {candidate.digest}  {candidate.kind}  {candidate.quant or '-'}  "
            f"tp {candidate.tp}  seq {candidate.max_seq_len}  {speed}"
            + (f"  ({note.split(' (')[0]})" if note else "")
        )
    if not ranked.candidates:
        lines.append("no candidate")
    if explain:
        lines += [f"rejected {c.digest[:19]}… {c.kind}: {reason}"
                  for c, reason in ranked.rejected]
        lines += [f"unproven {c.digest[:19]}… {c.kind}: {note}" for c in ranked.candidates
                  if ranked.gpu and (note := c.unproven_note(ranked.gpu))]
    return lines
