"""The nightly's report: JSON (`--json`, what `--notify` posts, what `nightly_runs` keeps),
text for the terminal, one self-contained HTML page (`--html`, in the style of `compare
--html`), and the POST of `--notify`. Pure except `write_html` and `notify`.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pipeline.compare import PAGE_CSS
from pipeline.keys import short_key
from pipeline.nightly.run import NightlyReport, TargetReport
from pipeline.promote import Level
from pipeline.settings import NOTIFY_TIMEOUT_DEFAULT_S
from registry.errors import UsageError


def _time(value: Any) -> str | None:
    return None if value is None else f"{value:%Y-%m-%d %H:%M:%S} UTC"


def paragraph(report: NightlyReport) -> str:
    """One paragraph for a chat webhook (Slack's `text`)."""
    if report.nothing_changed:
        since = _time(report.since)
        return "enginectl nightly: nothing changed" + (f" since {since}." if since else ".")
    parts = []
    for pool in report.pools:
        if pool.changes:
            parts.append(f"{pool.gpu or pool.pool}: " + ", ".join(str(c) for c in pool.changes))
    targets = [t for r in report.recipes for t in r.targets]
    verdicts: dict[str, int] = {}
    for target in targets:
        verdicts[target.verdict] = verdicts.get(target.verdict, 0) + 1
    moved = [p for t in targets for p in t.promotions if p.action == "promoted"]
    held = [p for t in targets for p in t.promotions if p.action == "held"]
    text = "enginectl nightly" + (" (dry run)" if report.dry_run else "") + ": "
    text += ("; ".join(parts) + ". ") if parts else "no toolchain change. "
    text += ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no target changed"
    text += f"; {len(moved)} aliases promoted, {len(held)} held"
    failures = [f for f in report.failures if f.get("outcome") != "held"]
    if failures:
        text += f"; {len(failures)} failed"
    return text + f". Exit {report.exit_code}."


def as_json(report: NightlyReport) -> dict[str, Any]:
    """The report as plain JSON values (README: `enginectl nightly --json`)."""
    return {
        "started_at": report.started_at.isoformat(),
        "finished_at": report.finished_at.isoformat() if report.finished_at else None,
        "executor": report.executor, "dry_run": report.dry_run,
        "nothing_changed": report.nothing_changed,
        "since": report.since.isoformat() if report.since else None,
        "waited_for": report.waited_for,
        "exit_code": report.exit_code,
        "pools": [p.as_dict() for p in report.pools],
        "recipes": [r.as_dict() for r in report.recipes],
        "failures": report.failures,
        "notify": report.notify,
        "text": paragraph(report),
    }


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _level_line(level: Level) -> str:
    return (f"c={level.concurrency:<4} {_rate(level.old_tokens_per_s):>8} → "
            f"{_rate(level.new_tokens_per_s):<8} tok/s   TTFT p50 "
            f"{_seconds(level.old_ttft_p50_s)} → {_seconds(level.new_ttft_p50_s)} s"
            + ("   REGRESSED" if level.regressed else ""))


def _target_lines(target: TargetReport) -> list[str]:
    lines = [f"  {target.id}: {target.verdict}"]
    for stage in target.stages:
        lines.append(f"    {stage.stage:<8} {short_key(stage.key)}  {stage.outcome:<13} "
                     f"{'; '.join(stage.because)}"
                     + (f"  → {stage.digest[:19]}…" if stage.digest else ""))
        if stage.error and stage.outcome not in ("built", "reused"):
            lines.append(f"      {stage.error}" + (f" (log {stage.log})" if stage.log else ""))
    lines += [f"    {_level_line(level)}" for level in target.levels]
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
    lines = []
    for pool in report.pools:
        if pool.changes:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): "
                         + ", ".join(str(c) for c in pool.changes))
        elif pool.before is None:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): first probe")
        else:
            lines.append(f"{pool.gpu or pool.pool} ({pool.pool}): unchanged")
    for recipe in report.recipes:
        if not recipe.targets and not recipe.error:
            lines.append(f"{recipe.name}: nothing to do")
            continue
        lines.append(f"{recipe.name} ({recipe.path}):")
        if recipe.error:
            lines.append(f"  FAILED {recipe.error}")
        for target in recipe.targets:
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


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_html(report: NightlyReport) -> str:
    """One self-contained page: no scripts, fonts or URLs."""
    title = "enginectl nightly " + (_time(report.started_at) or "")
    summary = f'<p class="note" id="summary">{_e(paragraph(report))}</p>'
    pools = ('<table id="pools"><thead><tr><th>pool</th><th>GPU</th><th>changes</th></tr>'
             "</thead><tbody>")
    body = [f"<h1>{_e(title)}</h1>", summary, "<h2>Pools</h2>", pools]
    for pool in report.pools:
        changes = ", ".join(str(c) for c in pool.changes) or (
            "first probe" if pool.before is None else "unchanged")
        body.append(f'<tr class="pool"><td>{_e(pool.pool)}</td><td>{_e(pool.gpu or "-")}</td>'
                    f"<td>{_e(changes)}</td></tr>")
    body.append("</tbody></table>")
    for recipe in report.recipes:
        body.append(f"<h2>{_e(recipe.name)}</h2>")
        if recipe.error:
            body.append(f'<p class="failure">{_e(recipe.error)}</p>')
        if not recipe.targets:
            body.append("<p>Nothing to do.</p>")
            continue
        body.append('<div class="wide"><table class="targets"><thead><tr><th class="label">'
                    "target</th><th>verdict</th><th>stages</th><th>tok/s old → new</th>"
                    "<th>TTFT p50 s old → new</th><th>aliases</th></tr></thead><tbody>")
        for target in recipe.targets:
            stages = "<br>".join(
                f"{_e(s.stage)} {_e(short_key(s.key))} {_e(s.outcome)}: {_e('; '.join(s.because))}"
                for s in target.stages)
            levels = target.levels or next((p.levels for p in target.promotions), [])
            rates = "<br>".join(f"c={lv.concurrency}: {_rate(lv.old_tokens_per_s)} → "
                                f"{_rate(lv.new_tokens_per_s)}" for lv in levels) or "-"
            ttfts = "<br>".join(f"c={lv.concurrency}: {_rate(lv.old_ttft_p50_s)} → "
                                f"{_rate(lv.new_ttft_p50_s)}" for lv in levels) or "-"
            aliases = "<br>".join(f"{_e(p.action)} {_e(p.alias)}: {_e(p.reason)}"
                                  for p in target.promotions) or "-"
            body.append(f'<tr class="target" data-verdict="{_e(target.verdict)}">'
                        f'<td class="label">{_e(target.id)}</td><td>{_e(target.verdict)}</td>'
                        f"<td>{stages}</td><td>{rates}</td><td>{ttfts}</td>"
                        f"<td>{aliases}</td></tr>")
        body.append("</tbody></table></div>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>", f"<style>{PAGE_CSS}</style></head><body>", *body,
        "</body></html>", ""])


def write_html(report: NightlyReport, path: Path) -> Path:
    """Write `render_html(report)` to *path* atomically; the absolute path written."""
    path = path.resolve()
    if not path.parent.is_dir():
        raise UsageError(f"--html {path}: directory {path.parent} does not exist")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(render_html(report))
        Path(temp).chmod(0o644)
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


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
