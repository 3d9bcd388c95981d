"""The nightly's report: JSON (`--json`, what `--notify` posts, what `nightly_runs` keeps),
text for the terminal, one self-contained HTML page (`--html`, in the style of `compare
--html`), and the POST of `--notify`. Pure except `write_html` and `notify`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from pipeline.nightly.verdict import VERDICTS, NightlyReport, TargetReport, ordered
from pipeline.planning.keys import short_key
from pipeline.serving.compare_html import PAGE_CSS, escape, write_page
from pipeline.serving.promote import LevelChange
from pipeline.settings import NOTIFY_TIMEOUT_DEFAULT_S


def _time(value: Any) -> str | None:
    return None if value is None else f"{value:%Y-%m-%d %H:%M:%S} UTC"


def _alarm(report: NightlyReport) -> str:
    """The toolchain regressions, one sentence each (what the summary leads with)."""
    return " ".join(f"TOOLCHAIN REGRESSION: {r['recipe']} {r['target']}"
                    + (" (incumbent)" if r["role"] == "incumbent" else "")
                    + f": {r['text']}." for r in report.regressions)


def paragraph(report: NightlyReport) -> str:
    """One paragraph for a chat webhook (Slack's `text`); toolchain regressions first."""
    if report.nothing_changed:
        since = _time(report.since)
        return "enginectl nightly: nothing changed" + (f" since {since}." if since else ".")
    parts = []
    for pool in report.pools:
        if pool.changes:
            parts.append(f"{pool.gpu or pool.pool}: " + ", ".join(str(c) for c in pool.changes))
    targets = report.targets
    verdicts: dict[str, int] = {}
    for target in targets:
        verdicts[target.verdict] = verdicts.get(target.verdict, 0) + 1
    moved = [p for t in targets for p in t.promotions if p.action == "promoted"]
    held = [p for t in targets for p in t.promotions if p.action == "held"]
    text = "enginectl nightly" + (" (dry run)" if report.dry_run else "") + ": "
    if report.regressions:
        text += _alarm(report) + " "
    text += ("; ".join(parts) + ". ") if parts else "no toolchain change. "
    text += ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(),
                                                     key=lambda i: VERDICTS.index(i[0]))) \
        or "no target changed"
    text += f"; {len(moved)} aliases promoted, {len(held)} held"
    failures = [f for f in report.failures if f.get("outcome") != "held"]
    if failures:
        text += f"; {len(failures)} failed"
    if targets and verdicts.keys() == {"skipped"}:
        text += "; every target skipped: this machine lacks their GPUs"
    return text + f". Exit {report.exit_code}."


def as_json(report: NightlyReport) -> dict[str, Any]:
    """The report as plain JSON values (README: `enginectl nightly --json`)."""
    return {
        "started_at": report.started_at.isoformat(),
        "finished_at": report.finished_at.isoformat() if report.finished_at else None,
        "executor": report.executor, "dry_run": report.dry_run,
        "accept_regression": report.accept_regression, "settled": report.settled,
        "nothing_changed": report.nothing_changed,
        "since": report.since.isoformat() if report.since else None,
        "waited_for": report.waited_for,
        "exit_code": report.exit_code,
        "pools": [p.as_dict() for p in report.pools],
        "recipes": [r.as_dict() for r in report.recipes],
        "regressions": report.regressions,
        "failures": report.failures,
        "notify": report.notify,
        "text": paragraph(report),
    }


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(seconds: float | None) -> str:
    """A time in milliseconds, to 3 significant digits or whole ms (`0.42`, `12.3`, `250`)."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _level_line(level: LevelChange) -> str:
    return (f"c={level.concurrency:<4} {_rate(level.old_tokens_per_s):>8} → "
            f"{_rate(level.new_tokens_per_s):<8} tok/s   TTFT p50 "
            f"{_ms(level.old_ttft_p50_s)} → {_ms(level.new_ttft_p50_s)} ms"
            + ("   REGRESSED" if level.regressed else ""))


def _target_lines(target: TargetReport) -> list[str]:
    detail = target.detail
    lines = [f"  {target.id}: {target.verdict}" + (f" ({detail})" if detail else "")]
    if target.evidence and target.verdict not in ("unchanged", "skipped"):
        lines.append(f"    evidence: {target.evidence}")
    for stage in target.stages:
        lines.append(f"    {stage.stage:<8} {short_key(stage.key)}  {stage.outcome:<13} "
                     f"{'; '.join(stage.because)}"
                     + (f"  → {stage.digest[:19]}…" if stage.digest else ""))
        if stage.error and stage.outcome not in ("built", "reused"):
            lines.append(f"      {stage.error}" + (f" (log {stage.log})" if stage.log else ""))
    for regression in target.regressions:
        lines.append(f"    REGRESSED {regression.role} {regression.digest[:19]}… "
                     f"({regression.cause}), its last proof → now:")
        lines += [f"      {_level_line(level)}" for level in regression.levels]
    if not target.regressions:
        lines += [f"    {_level_line(level)}" for level in target.levels]
    if target.start and target.start.get("ready_s") is not None:
        warm = target.start.get("warm_cache")
        lines.append(f"    start    {target.start['ready_s']:.1f} s to ready, "
                     + (f"warm (from {str(warm)[:19]}…, warm_cache: "
                        f"{target.start.get('warm_use') or 'not observed'})" if warm else "cold"))
    for promotion in target.promotions:
        old = promotion.old[:19] + "…" if promotion.old else "nothing"
        new = promotion.new[:19] + "…" if promotion.new else "-"
        action = "HELD" if promotion.action == "held" else promotion.action
        lines.append(f"    {action} {promotion.alias}: {old} → {new} ({promotion.reason})")
        if promotion.action in ("held", "promoted"):
            lines += [f"      {_level_line(level)}" for level in promotion.levels]
    return lines


def text_lines(report: NightlyReport) -> list[str]:
    if report.nothing_changed:
        return [paragraph(report).removeprefix("enginectl nightly: ")]
    lines = [_alarm(report)] if report.regressions else []
    for pool in report.pools:
        if pool.changes:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): "
                         + ", ".join(str(c) for c in pool.changes))
        elif pool.before is None:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): first probe")
        else:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): unchanged")
    for recipe in report.recipes:
        if all(t.verdict == "unchanged" for t in recipe.targets) and not recipe.error:
            lines.append(f"{recipe.name}: nothing to do")
            continue
        lines.append(f"{recipe.name} ({recipe.path}):")
        if recipe.error:
            lines.append(f"  FAILED {recipe.error}")
        for target in ordered(recipe.targets):
            lines += _target_lines(target)
    failures = report.failures
    if failures:
        lines.append(f"{len(failures)} failures:")
        for failure in failures:
            where = " ".join(str(failure.get(k)) for k in ("recipe", "target", "stage")
                             if failure.get(k))
            log = f" (log {failure['log']})" if failure.get("log") else \
                (f"; `enginectl logs {failure['key']}`" if failure.get("key") else "")
            lines.append(f"  {where}: {failure.get('error')}{log}")
    lines.append(paragraph(report))
    return lines


PAGE_WIDTH_PX: Final = 1280
"""The page fits a window this wide: cells wrap, nothing scrolls sideways."""

_NIGHTLY_CSS: Final = """
body { max-width: 1232px; }
table.targets, table#pools { table-layout: fixed; width: 100%; }
table.targets td, table#pools td { white-space: normal; overflow-wrap: anywhere;
  vertical-align: top; text-align: left; }
table.targets th, table#pools th { white-space: normal; text-align: left; }
table.targets td.num { text-align: right; white-space: nowrap; }
table.targets col.target { width: 22%; } table.targets col.verdict { width: 9%; }
table.targets col.detail { width: 27%; } table.targets col.num { width: 13%; }
table.targets col.aliases { width: 16%; }
tr[data-verdict="regressed"] td, tr[data-verdict="failed"] td { background: #fde8e8; }
tr[data-verdict="held"] td { background: #fff4d6; }
td details { font-size: 12px; color: #444; }
p.alarm { background: #fde8e8; border: 2px solid #b00020; color: #b00020; font-weight: bold;
  padding: 8px 12px; }
span.kept { color: #444; font-size: 12px; }
"""


def _link(target: TargetReport) -> str:
    """The verdict, linked to the log or smoke report log it came from (when there is one)."""
    verdict = escape(target.verdict)
    if not target.evidence:
        return f"<b>{verdict}</b>"
    href = escape(Path(target.evidence).as_uri())
    return f'<a class="evidence" href="{href}"><b>{verdict}</b></a>'


def _target_row(target: TargetReport) -> str:
    regression = target.regressions[0] if target.regressions else None
    held = next((p for p in target.promotions if p.action == "held"), None)
    kept = ""
    if regression is not None:
        levels = regression.levels
    elif held is not None:  # what the alias keeps, beside the candidate it did not take
        levels = held.levels
        kept = (f'<span class="kept">{escape(held.alias)} keeps '
                f'{escape((held.old or "nothing")[:19])}… → candidate</span><br>')
    else:
        levels = target.levels or next((p.levels for p in target.promotions if p.levels), [])
    rates = kept + "<br>".join(f"c={lv.concurrency}: {_rate(lv.old_tokens_per_s)} → "
                               f"{_rate(lv.new_tokens_per_s)}" for lv in levels) or "-"
    ttfts = "<br>".join(f"c={lv.concurrency}: {_ms(lv.old_ttft_p50_s)} → "
                        f"{_ms(lv.new_ttft_p50_s)}" for lv in levels) or "-"
    aliases = "<br>".join(f"{escape(p.action)} {escape(p.alias)}: {escape(p.reason)}"
                          for p in target.promotions) or "-"
    stages = "<br>".join(
        f"{escape(s.stage)} {escape(short_key(s.key))} {escape(s.outcome)}: "
        f"{escape('; '.join(s.because))}"
        for s in target.stages)
    detail = escape(target.detail)
    if stages:
        detail += f"<details><summary>stages</summary>{stages}</details>"
    return (f'<tr class="target" data-verdict="{escape(target.verdict)}">'
            f"<td>{escape(target.id)}</td><td>{_link(target)}</td><td>{detail or '-'}</td>"
            f'<td class="num">{rates}</td><td class="num">{ttfts}</td>'
            f"<td>{aliases}</td></tr>")


def render_html(report: NightlyReport) -> str:
    """One self-contained page that fits `PAGE_WIDTH_PX`: no scripts, fonts or URLs but
    the file links to each verdict's log. Per recipe, regressions, failures and holds
    first; times in ms."""
    title = "enginectl nightly " + (_time(report.started_at) or "")
    summary = f'<p class="note" id="summary">{escape(paragraph(report))}</p>'
    pools = ('<table id="pools"><thead><tr><th>pool</th><th>GPU</th><th>changes</th></tr>'
             "</thead><tbody>")
    alarm = [f'<p class="alarm" id="alarm">{escape(_alarm(report))}</p>'] \
        if report.regressions else []
    body = [f"<h1>{escape(title)}</h1>", *alarm, summary, "<h2>Pools</h2>", pools]
    for pool in report.pools:
        changes = ", ".join(str(c) for c in pool.changes) or (
            "first probe" if pool.before is None else "unchanged")
        body.append(f'<tr class="pool"><td>{escape(pool.pool)}</td>'
                    f'<td>{escape(pool.gpu or "-")}</td>'
                    f"<td>{escape(changes)}</td></tr>")
    body.append("</tbody></table>")
    for recipe in report.recipes:
        body.append(f"<h2>{escape(recipe.name)}</h2>")
        if recipe.error:
            body.append(f'<p class="failure">{escape(recipe.error)}</p>')
        if not recipe.targets:
            body.append("<p>Nothing to do.</p>")
            continue
        body.append('<table class="targets"><colgroup><col class="target"><col class="verdict">'
                    '<col class="detail"><col class="num"><col class="num"><col class="aliases">'
                    '</colgroup><thead><tr><th>target</th><th>verdict</th><th>why</th>'
                    "<th>tok/s old → new</th><th>TTFT p50 ms old → new</th><th>aliases</th>"
                    "</tr></thead><tbody>")
        body += [_target_row(target) for target in ordered(recipe.targets)]
        body.append("</tbody></table>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="viewport" content="width={PAGE_WIDTH_PX}">',
        f"<title>{escape(title)}</title>", f"<style>{PAGE_CSS}{_NIGHTLY_CSS}</style></head><body>",
        *body, "</body></html>", ""])


def write_html(report: NightlyReport, path: Path) -> Path:
    """Write `render_html(report)` to *path* atomically; the absolute path written."""
    return write_page(path, lambda: render_html(report))


def notify_url_problem(url: str) -> str | None:
    """Why *url* cannot be `--notify`'s webhook, in a few words, or None; pure, so the CLI
    asks before the run starts."""
    from urllib.parse import urlsplit

    if not url:
        return "an empty URL"
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url):
        return "a URL cannot hold spaces, line breaks or other control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "not an http:// or https:// URL"
    if not parts.hostname:
        return "no host in the URL"
    return None


def notify(report: NightlyReport, url: str, *,
           timeout_s: float = NOTIFY_TIMEOUT_DEFAULT_S) -> dict[str, Any]:
    """POST the JSON report (with its `text` paragraph) to *url*; what happened, never an
    exception: a webhook that fails does not fail the run. *timeout_s* bounds the whole
    notification (name lookup, connect, sending, the answer's headers), not each read: a
    server that drips its answer a byte at a time is given up on at the deadline, the POST
    left to end with the process."""
    import threading
    import urllib.error
    import urllib.request

    problem = notify_url_problem(url)
    if problem is not None:
        return {"url": url, "ok": False, "error": problem}
    data = json.dumps(as_json(report), default=str).encode()
    request = urllib.request.Request(url, data=data, method="POST",  # noqa: S310 - checked
                                     headers={"Content-Type": "application/json"})
    outcome: list[dict[str, Any]] = []

    def post() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
                outcome.append({"url": url, "ok": True, "status": answer.status})
        except urllib.error.HTTPError as exc:
            outcome.append({"url": url, "ok": False, "status": exc.code,
                            "error": f"HTTP {exc.code}"})
        except Exception as exc:  # noqa: BLE001 - whatever it is, the run's result stands
            outcome.append({"url": url, "ok": False, "error": " ".join(str(exc).split())})

    sender = threading.Thread(target=post, name="enginectl-notify", daemon=True)
    sender.start()
    sender.join(timeout_s)
    if not outcome:
        return {"url": url, "ok": False, "error": f"no answer within {timeout_s:g} s"}
    return outcome[0]
