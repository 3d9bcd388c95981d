"""The `enginectl nightly` command: requalify recipes after toolchain bumps (pipeline.nightly)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import QUIET, echo_json, handle_errors, main, note, verbosity


@main.command()
@click.argument("recipes", nargs=-1, type=click.Path(path_type=Path, exists=True))
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, envvar="ENGINECTL_EXECUTOR",
              help="Where stages run and which pools are probed: this machine, or a Ray "
                   "cluster's pools.")
@click.option("--address", envvar="RAY_ADDRESS", default="auto", show_default=True,
              help="With --executor ray: auto, HOST:6379 or ray://HEAD:10001 ($RAY_ADDRESS).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Stage runs in parallel on the local executor.")
@click.option("--accept-regression", is_flag=True,
              help="Move aliases of a pool whose toolchain regressed (held otherwise); the "
                   "run still exits 5 for the regression.")
@click.option("--dry-run", is_flag=True,
              help="Probe and say what a run would rebuild and why; build nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the report as one self-contained HTML page.")
@click.option("--notify", "notify_url", metavar="URL",
              help="POST the JSON report (with a one-paragraph `text`) to this webhook; a "
                   "failed POST is reported and never fails the run.")
@handle_errors
def nightly(recipes: tuple[Path, ...], executor: str, address: str, jobs: int,
            accept_regression: bool, dry_run: bool, as_json: bool, html_path: Path | None,
            notify_url: str | None) -> None:
    """Requalify RECIPES (files or directories; none: every recipe the registry has
    recorded, at its latest content) after toolchain bumps.

    Probes each pool the recipes need and diffs it with the toolchain the last nightly
    that finished its work saw, re-plans, builds and smoke-tests what the bump
    invalidated, and moves each `promote` alias only to an artifact that is ready and no
    slower than the one it replaces (by the recipe's max_regression). One nightly runs at
    a time; a second waits for it. A second run with nothing changed does nothing.

    Every target gets one verdict: regressed, failed (machine or artifact fault), held,
    promoted, rebuilt, re-proved, skipped (this machine lacks its GPU) or unchanged. A
    re-proof slower than its last proof on the previous toolchain by more than the recipe's
    nightly.max_regression (default 0.10) is a toolchain regression, reported first; no
    alias of that pool moves (held) unless the run is given --accept-regression. A nightly
    killed or stopped midway is finished by the next one.

    Exit 5 a toolchain regression; else 3 a stage failed by the machine's fault or before
    the smoke; else 5 a smoke failed or the gate held an alias; else 0 (skipped targets
    included). Every failure is listed with its log. Exit 2, one line, nothing recorded,
    when no Ray cluster answers at --address.

    \b
    Examples:
      enginectl nightly                                   # every recorded recipe
      enginectl nightly recipes/ --dry-run                # what it would rebuild, and why
      enginectl nightly recipes/llama70b-h100.yaml --executor ray --json
      enginectl nightly --html /srv/reports/nightly.html --notify https://hooks.slack.com/…
    """
    from pipeline.nightly.report import as_json as report_json
    from pipeline.nightly.report import notify, notify_url_problem, text_lines, write_html
    from pipeline.nightly.run import nightly as run_nightly
    from pipeline.settings import notify_timeout_s
    from registry.errors import UsageError

    if html_path is not None and not html_path.resolve().parent.is_dir():  # before the work
        raise UsageError(f"--html {html_path}: directory {html_path.resolve().parent} does "
                         "not exist")
    if notify_url is not None:  # before the work: a run's report is not lost to a typo
        if (problem := notify_url_problem(notify_url)) is not None:
            raise UsageError(f"--notify {notify_url!r}: {problem}")
        timeout_s = notify_timeout_s()
    quiet = verbosity() <= QUIET
    echo = None if as_json or quiet else click.echo
    from pipeline.settings import Settings
    from registry.context import Context

    with Context() as ctx:
        report = run_nightly(recipes, ctx=ctx, settings=Settings.from_env(), executor=executor,
                             address=address, dry_run=dry_run, jobs=jobs, echo=echo,
                             note=note, accept_regression=accept_regression)
    if notify_url is not None:
        report.notify = notify(report, notify_url, timeout_s=timeout_s)
        if not report.notify["ok"]:
            note(f"--notify {notify_url}: the POST failed ({report.notify.get('error')}); "
                 "the run's result stands")
    if as_json:
        echo_json(report_json(report))
    else:
        click.echo("\n".join(text_lines(report)))
    if html_path is not None:
        click.echo(f"wrote {write_html(report, html_path)}", err=as_json)
    if report.exit_code:
        raise SystemExit(report.exit_code)
