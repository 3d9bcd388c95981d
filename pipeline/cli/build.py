"""Commands on recipes and their stage chains: plan, build, smoke, compare, toolchain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.base import (
    MODEL,
    QUIET,
    REF,
    VERBOSE,
    announce,
    context,
    detail,
    echo_json,
    handle_errors,
    main,
    note,
    verbosity,
)

RECIPE = click.Path(path_type=Path, dir_okay=False)

EXECUTOR = click.option(
    "--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
    envvar="ENGINECTL_EXECUTOR", help="Where stages run: this machine, or a Ray cluster.")


@main.command()
@click.argument("recipe", type=RECIPE)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--commands", is_flag=True, help="Print the argv of every program it would run.")
@EXECUTOR
@click.option("--toolchain", "bumps", multiple=True, metavar="FIELD=VALUE",
              help="What if: key with this fingerprint field changed (driver, cuda, tensorrt, "
                   "trtllm, image, modelopt, torch, transformers, vllm) and say which keys "
                   "it changes (repeatable).")
@click.option("--pool", "named", multiple=True, metavar="POOL",
              help="Key the targets on this pool's GPU with its last recorded probe: "
                   "host:HOSTNAME or a Ray pool's SKU (repeatable).")
@handle_errors
def plan(recipe: Path, as_json: bool, commands: bool, executor: str,
         bumps: tuple[str, ...], named: tuple[str, ...]) -> None:
    """Show what RECIPE would build, what it shares, and what fits; touches no GPU.

    Each target is keyed with the toolchain last recorded for the pool that runs its GPU
    stages (this machine if it has run that GPU, else the host that ran it last, else the
    Ray pool of that SKU; with --executor ray the Ray pool first, every group of a pool
    mid-upgrade), so "built" and "new" say what a build there would do, on this laptop
    too: a local build here changes nothing for a GPU it lacks. Targets on no GPU use this
    machine's last probe; a pool never probed, the builder image's versions (a note says
    so). No cluster is contacted. With --toolchain, the plan is keyed as after that bump,
    and the keys it changes are listed with the field that changed each.

    \b
    Examples:
      enginectl plan recipes/llama70b-h100.yaml
      enginectl plan recipes/llama70b-h100.yaml --commands | head -n 3
      enginectl plan recipes/llama8b-fleet.yaml --json | jq '.targets[].id'
      enginectl plan recipes/llama8b-fleet.yaml --executor ray
      enginectl plan recipes/llama70b-h100.yaml --pool host:gpu-builder-2
      enginectl plan recipes/llama70b-h100.yaml --toolchain driver=575.57.08
    """
    from pipeline.executors.preview import (
        group_plan_lines,
        parse_overrides,
        preview,
        store_bytes,
        store_bytes_line,
    )
    from pipeline.planning.source import read_recipe
    from pipeline.settings import Settings
    from registry.config import RegistryConfig

    overrides = parse_overrides(bumps)
    loaded = read_recipe(recipe)
    url = RegistryConfig.from_env().registry_url
    pools = "ray" if executor == "ray" else "local"
    shown = preview(loaded, Settings.from_env(), registry_url=url, pools=pools,
                    overrides=overrides, named=named)
    the_plan = shown.plan
    for line in shown.notes:
        note(line)
    if executor == "local":  # a build here refuses what this node lacks the GPUs for
        from pipeline.planning.capacity import plan_notes, this_node

        for line in plan_notes(the_plan, this_node()):
            note(line)
    changes = None
    if overrides:
        from pipeline.nightly.diff import key_changes

        base = preview(loaded, Settings.from_env(), registry_url=url, pools=pools,
                       named=named)
        changes = key_changes(base.plan, the_plan)
    if as_json:
        data = the_plan.as_dict(built=lambda key: key in shown.built)
        data["recipe"]["toolchain_source"] = shown.toolchain_source
        data["recipe"]["toolchain_sources"] = shown.sources
        data["store_bytes"] = store_bytes(the_plan)
        if changes is not None:
            data["changed_keys"] = [change.as_dict() for change in changes]
        echo_json(data)
    elif commands:
        import shlex

        for argv in the_plan.commands():
            click.echo(shlex.join(argv))
    else:
        from pipeline.listings import plan_lines

        stored = store_bytes(the_plan)
        click.echo("\n".join(plan_lines(the_plan, built=frozenset(shown.built),
                                           toolchain_source=shown.toolchain_source)
                              + ([store_bytes_line(stored)] if stored["engines"] else [])
                              + group_plan_lines(shown)))
    if changes is not None and not as_json and not commands:
        from pipeline.planning.keys import short_key

        bump = ", ".join(f"{k}={v}" for k, v in overrides.items())
        click.echo(f"\n{bump} changes {len(changes)} keys:")
        for change in changes:
            click.echo(f"  {change.stage:<8} {short_key(change.old_key)} → "
                       f"{short_key(change.new_key)}  {change.target}: "
                       f"{'; '.join(change.because)}")


@main.command()
@click.argument("recipe", type=RECIPE)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Stage runs in parallel (GPU stages never share a GPU).")
@click.option("--only", "only", metavar="PATTERN", help="Targets whose id matches this glob.")
@click.option("--force", is_flag=True, help="Rebuild even what the registry already has.")
@click.option("--keep-going", is_flag=True, help="Continue independent targets after a failure.")
@click.option("--dry-run", is_flag=True, help="Show the plan with hit/miss per stage; run nothing.")
@click.option("--keep-work", is_flag=True,
              help="Keep every stage's output in the work directory (by default a published "
                   "output is removed once no later stage of the build reads it).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@EXECUTOR
@click.option("--address", envvar="RAY_ADDRESS", default="auto", show_default=True,
              help="With --executor ray: auto, HOST:6379 or ray://HEAD:10001 ($RAY_ADDRESS).")
@handle_errors
def build(recipe: Path, jobs: int, only: str | None, force: bool, keep_going: bool,
          dry_run: bool, keep_work: bool, as_json: bool, executor: str,
          address: str) -> None:
    """Run RECIPE's stage chain: reuse every stage the registry has, build the rest,
    publish each output, and smoke-serve what this machine can serve.

    Ctrl-C stops the running stages (recorded `cancelled`, partial output removed) and
    exits 130; the stages that finished are published, so a re-run resumes from them.

    \b
    Examples:
      enginectl build recipes/tiny-llama-cpu.yaml
      enginectl build recipes/llama70b-h100.yaml --jobs 4 --only 'H100*/tp8/*'
      enginectl build RECIPE --dry-run            # hit or miss for every stage
      enginectl -q build RECIPE --json            # the summary alone, for machines
      enginectl build recipes/llama8b-fleet.yaml --executor ray --address ray://head:10001
    """
    import sys

    from pipeline.errors import BuildCancelledError
    from pipeline.executors.result import BuildOptions
    from pipeline.executors.view import summary_lines
    from pipeline.settings import Settings
    from registry.context import Context

    ctx = Context()
    announce(ctx)
    quiet = verbosity() <= QUIET
    echo = None if as_json or quiet else click.echo
    settings = Settings.from_env()
    try:
        with ctx:
            probed, done = None, None
            if executor == "local" and not (force or dry_run):
                probed, done = _remembered_noop(recipe, ctx, settings, only=only, echo=echo)
            if done is not None:
                stages, summary, promotions = done[0], done[1], []
            else:
                from pipeline.executors.build import build_recipe

                result = build_recipe(recipe, ctx=ctx, settings=settings,
                                      options=BuildOptions(
                                          jobs=jobs, only=only, force=force,
                                          keep_going=keep_going, dry_run=dry_run,
                                          keep_work=keep_work, echo=echo,
                                          live=sys.stdout.isatty() and not quiet,
                                          run_on=executor, address=address),
                                      probed=probed)
                stages, summary, promotions = (result.plan.stages, result.summary,
                                               result.promotions)
    except BuildCancelledError as exc:
        if as_json and exc.summary is not None:
            echo_json(exc.summary.as_dict())
        raise
    if dry_run:
        from pipeline.executors.view import dry_run_lines

        if as_json:
            echo_json(result.plan.as_dict(built=lambda key: key in result.hits))
        else:
            click.echo("\n".join(dry_run_lines(result)))
        return
    if as_json:
        echo_json({**summary.as_dict(), "promotions": [p.as_dict() for p in promotions]})
    else:
        click.echo("\n".join(summary_lines(summary, promotions)))
    if verbosity() >= VERBOSE:
        _details(stages, summary)
    _raise_if_failed(summary)


def _remembered_noop(recipe: Path, ctx: Any, settings: Any, *, only: str | None,
                     echo: Any) -> tuple[Any, tuple[Any, Any] | None]:
    """A build with nothing to do, from the plan a build remembered
    (`pipeline.executors.noop.remembered_noop`), said as `build_recipe` says it: this
    machine's probe, which the build takes instead of probing again (None when it raised:
    the build probes again and says it in its own order), and the plan's stage runs and the
    summary (None when the build must plan)."""
    from pipeline.executors.noop import remembered_noop
    from pipeline.executors.view import describe
    from pipeline.planning.plan_cache import cache_dir
    from pipeline.planning.probe import probe

    try:
        found = probe(settings, remember=cache_dir(settings))
    except Exception:  # noqa: BLE001 - said by the build, after what it finds in the recipe
        return None, None
    done = remembered_noop(recipe, found, settings=settings,
                           registry_url=ctx.config.registry_url, only=only)
    if done is None:
        return found, None
    ctx.begin(store=False)  # nothing is read from the store, nor written
    if echo is not None:
        for outcome in done[1].outcomes:
            echo(describe(outcome))
    return found, (done[0].stages, done[1])


def _raise_if_failed(summary: Any) -> None:
    """A stage that failed or stopped: StageError (exit 3); a smoke that failed: SmokeError."""
    stopped = summary.failed + [o for o in summary.outcomes if o.status == "cancelled"]
    if stopped:
        from pipeline.errors import StageError

        first = stopped[0]
        raise StageError(first.stage, first.key, first.error or "failed",
                         target=first.targets[0] if first.targets else None)
    smoke_failed = [o for o in summary.outcomes if o.status == "smoke-failed"]
    if smoke_failed:
        from pipeline.errors import SmokeError

        raise SmokeError(smoke_failed[0].digest or "?", smoke_failed[0].error or "failed")


def _details(stages: Any, summary: Any) -> None:
    """-v: where each run's log is, how long it took, and the tail of each failed run's."""
    from pipeline.host.runner import log_tail

    for outcome in summary.outcomes:
        run = stages.get(outcome.key)
        if run is None or outcome.status in ("reused", "skipped"):
            continue
        log = run.workdir / f"{run.stage}.log"
        detail(f"{outcome.status:<13} {run.stage:<8} {outcome.seconds:7.1f}s  log {log}")
        if outcome.status in ("failed", "smoke-failed") and log.is_file():
            detail("\n".join(f"    | {line}" for line in log_tail(log, 20).splitlines()))


@main.command()
@click.option("--model", required=True, type=MODEL, help="The model, as recipes name it.")
@click.option("--gpu", help="Only engines for this GPU SKU (checkpoints and vLLM always show).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write a self-contained HTML page with a throughput chart.")
@handle_errors
def compare(model: str, gpu: str | None, as_json: bool, html_path: Path | None) -> None:
    """Side by side: tokens/s, TTFT, $/1M tokens, cold start, build time and size of each
    ready artifact of a model, from its latest passing smoke report.

    \b
    Examples:
      enginectl compare --model llama-3.3-70b-instruct --gpu h100
      enginectl compare --model tiny-llama --html compare.html
    """
    from pipeline.serving.compare import compare as compare_artifacts
    from pipeline.serving.compare import render_table
    from pipeline.serving.compare_html import write_html
    comparison = compare_artifacts(context(readonly=True), model, gpu)
    if as_json:
        echo_json(comparison.as_dict())
    else:
        click.echo(render_table(comparison))
    if html_path is not None:
        written = write_html(comparison, html_path)
        click.echo(f"wrote {written}", err=as_json)


@main.command()
@click.argument("ref", type=REF)
@click.option("--json", "as_json", is_flag=True, help="Print the smoke report as JSON.")
@handle_errors
def smoke(ref: str, as_json: bool) -> None:
    """Smoke-serve REF here with its real server; record the report; ready or quarantined.

    A pass makes REF `ready`, also after a quarantine (how a wrong one is cleared), but a
    `superseded` one stays superseded (what replaced it, or a rollback, still stands); a
    failed check quarantines it (exit 5). When this machine cannot serve it (no GPU of its
    SKU, vLLM's Python without vllm, no trtllm-serve) nothing is recorded, its status stays,
    and the reason is printed (exit 3).

    \b
    Examples:
      enginectl smoke 9f86d081884c
      enginectl smoke llama70b/h100/prod --json
    """
    from pipeline.serving.smoke_here import smoke_artifact
    from pipeline.settings import Settings
    from registry.context import Context

    with Context() as ctx:
        digest, report = smoke_artifact(ref, ctx=ctx, settings=Settings.from_env())
    if as_json:
        echo_json({"digest": digest, **report.as_dict()})
    else:
        for check in report.checks:
            click.echo(f"{'pass' if check.passed else 'FAIL'}  {check.name:<12} {check.message}")
        for level in report.load:
            click.echo(f"load  c={level.concurrency:<4} {level.output_tokens_per_s:8.1f} tok/s  "
                       f"TTFT p50 {level.ttft_p50_s}  p95 {level.ttft_p95_s}  "
                       f"errors {level.errors}")
        status = "quarantined"
        if report.passed:  # ready, or superseded: a re-smoke keeps what replaced it
            from registry.sql.records import get_status

            with context(readonly=True).registry.session(readonly=True) as session:
                status = get_status(session, digest) or "ready"
        click.echo(f"{digest}: {status}")
    detail(f"server log {report.log_path}")
    if not report.passed:
        from pipeline.errors import SmokeError

        raise SmokeError(digest, report.failure or "failed")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint as JSON.")
@handle_errors
def toolchain(as_json: bool) -> None:
    """Print this machine's toolchain fingerprint (GPU, driver, CUDA, TensorRT, TRT-LLM, …),
    each field with where it was read: nvidia-smi, the builder's Python (ENGINECTL_PYTHON),
    vLLM's Python (ENGINECTL_VLLM_PYTHON), ENGINECTL_IMAGE_DIGEST.

    \b
    Examples:
      enginectl toolchain
      enginectl toolchain --json
    """
    from pipeline.planning.probe import probe
    from pipeline.settings import Settings

    found = probe(Settings.from_env())
    data = {**found.toolchain.as_dict(), "gpu_name": found.gpu_name,
            "gpu_count": found.gpu_count, "note": found.note, "sources": dict(found.sources)}
    if as_json:
        echo_json(data)
        return
    fields = found.toolchain.as_dict()
    width = max(len(str(v)) for v in (*fields.values(), found.gpu_name, "-"))
    for name, value in fields.items():
        shown = value if value is not None else "-"
        click.echo(f"{name:<12} {shown!s:<{width}}  {found.sources.get(name, '')}".rstrip())
    click.echo(f"{'gpu_name':<12} {found.gpu_name or '-'}")
    click.echo(f"{'gpu_count':<12} {found.gpu_count}")
    if found.note:
        click.echo(found.note)
