"""The `enginectl` command line: parse, call one library function, print.

Only this module catches errors. Exit codes: 0 ok, 2 bad usage or recipe, 3 a stage failed,
4 registry, store or integrity error, 5 smoke check failed, 1 anything unexpected
(`--traceback` shows the stack). Heavy modules are imported inside commands so that
`enginectl --help` stays fast.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from registry.errors import EnginectlError

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int) -> None:
    click.echo(f"enginectl: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn enginectl errors into one line and an exit code; anything else into exit 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        show_traceback = bool(ctx.find_root().params.get("traceback"))
        try:
            return func(*args, **kwargs)
        except EnginectlError as exc:
            if show_traceback:
                traceback.print_exc()
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the one place that catches everything
            if show_traceback:
                traceback.print_exc()
            _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --traceback)", 1)
        return None

    return wrapper  # type: ignore[return-value]


def _echo_json(value: Any) -> None:
    """Indented for a person at a terminal; compact (and several times faster to write,
    through json's C encoder) for the programs that read `--json`."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(value, indent=indent, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--traceback", is_flag=True, help="Show the Python stack on errors.")
@click.version_option(package_name="enginectl")
def main(traceback: bool) -> None:
    """Turn a model recipe into TensorRT-LLM engines, quantized checkpoints and vLLM
    profiles, each proven to serve, stored by content and fetched by hash."""
    del traceback  # read through the context by handle_errors


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--commands", is_flag=True, help="Print the argv of every program it would run.")
@handle_errors
def plan(recipe: Path, as_json: bool, commands: bool) -> None:
    """Show what RECIPE would build, what it shares, and what fits; touches no GPU."""
    from pipeline.plan import plan_recipe
    from pipeline.recipe import load_recipe
    from pipeline.settings import Settings

    the_plan = plan_recipe(load_recipe(recipe), Settings.from_env())
    if as_json:
        _echo_json(the_plan.as_dict())
    elif commands:
        import shlex

        for argv in the_plan.commands():
            click.echo(shlex.join(argv))
    else:
        from pipeline.report import print_plan

        print_plan(the_plan)


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path, dir_okay=False))
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Stage runs in parallel (GPU stages never share a GPU).")
@click.option("--only", "only", metavar="PATTERN", help="Targets whose id matches this glob.")
@click.option("--force", is_flag=True, help="Rebuild even what the registry already has.")
@click.option("--keep-going", is_flag=True, help="Continue independent targets after a failure.")
@click.option("--dry-run", is_flag=True, help="Show the plan with hit/miss per stage; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@handle_errors
def build(recipe: Path, jobs: int, only: str | None, force: bool, keep_going: bool,
          dry_run: bool, as_json: bool) -> None:
    """Run RECIPE's stage chain: reuse every stage the registry has, build the rest."""
    from pipeline.build import build_recipe, dry_run_lines, summary_lines

    result = build_recipe(recipe, jobs=jobs, only=only, force=force, keep_going=keep_going,
                          dry_run=dry_run, echo=None if as_json else click.echo)
    if dry_run:
        if as_json:
            _echo_json(result.plan.as_dict(built=lambda key: key in result.hits))
        else:
            click.echo("\n".join(dry_run_lines(result)))
        return
    if as_json:
        _echo_json(result.summary.as_dict())
    else:
        click.echo("\n".join(summary_lines(result)))
    if result.summary.failed:
        from pipeline.errors import StageError

        first = result.summary.failed[0]
        raise StageError(first.stage, first.key, first.error or "failed",
                         target=first.targets[0] if first.targets else None)
    smoke_failed = [o for o in result.summary.outcomes if o.status == "smoke-failed"]
    if smoke_failed:
        from pipeline.errors import SmokeError

        raise SmokeError(smoke_failed[0].digest or "?", smoke_failed[0].error or "failed")


@main.command()
@click.option("--model", required=True)
@click.option("--gpu", help="Only engines for this GPU SKU (checkpoints and vLLM always show).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write a self-contained HTML page with a throughput chart.")
@handle_errors
def compare(model: str, gpu: str | None, as_json: bool, html_path: Path | None) -> None:
    """Side by side: tokens/s, TTFT, $/1M tokens, cold start, build time and size of each
    ready artifact of a model, from its latest passing smoke report."""
    from pipeline.compare import compare as compare_artifacts
    from pipeline.compare import render_table, write_html

    comparison = compare_artifacts(_context(), model, gpu)
    if as_json:
        _echo_json(comparison.as_dict())
    else:
        click.echo(render_table(comparison))
    if html_path is not None:
        written = write_html(comparison, html_path)
        click.echo(f"wrote {written}", err=as_json)


@main.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def smoke(ref: str, as_json: bool) -> None:
    """Smoke-serve REF here with its real server; record the report; ready or quarantined."""
    from pipeline.stages.smoke import smoke_artifact

    digest, report = smoke_artifact(ref)
    if as_json:
        _echo_json({"digest": digest, **report.as_dict()})
    else:
        for check in report.checks:
            click.echo(f"{'pass' if check.passed else 'FAIL'}  {check.name:<12} {check.message}")
        for level in report.load:
            click.echo(f"load  c={level.concurrency:<4} {level.output_tokens_per_s:8.1f} tok/s  "
                       f"TTFT p50 {level.ttft_p50_s}  p95 {level.ttft_p95_s}  "
                       f"errors {level.errors}")
        click.echo(f"{digest}: {'ready' if report.passed else 'quarantined'}")
    if not report.passed:
        from pipeline.errors import SmokeError

        raise SmokeError(digest, report.failure or "failed")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def toolchain(as_json: bool) -> None:
    """Print this machine's toolchain fingerprint (GPU, driver, CUDA, TensorRT, TRT-LLM, …)."""
    import os

    from pipeline.settings import Settings
    from pipeline.toolchain import probe

    found = probe(Settings.from_env().python, os.environ.get("ENGINECTL_IMAGE_DIGEST"))
    data = {**found.toolchain.as_dict(), "gpu_name": found.gpu_name,
            "gpu_count": found.gpu_count, "note": found.note}
    if as_json:
        _echo_json(data)
        return
    for name, value in data.items():
        if name != "note":
            click.echo(f"{name:<13} {value if value is not None else '-'}")
    if found.note:
        click.echo(found.note)


# ---- registry commands -------------------------------------------------------------------


def _context() -> Any:
    from registry.context import Context

    return Context()




def _progress() -> Any:
    from pipeline.progress import terminal_progress

    return terminal_progress()


def _parse_shape(text: str | None) -> dict[str, int] | None:
    """`--shape max_batch_size=8,max_input_len=1024,max_seq_len=2048`"""
    if not text:
        return None
    from registry.adopt import SHAPE_FIELDS
    from registry.errors import UsageError

    shape: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in SHAPE_FIELDS or not value.strip().isdigit():
            raise UsageError(
                f"--shape {part!r}: expected NAME=INT with NAME in {', '.join(SHAPE_FIELDS)}"
            )
        shape[name] = int(value)
    return shape


@main.command("import")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--kind", required=True, help="trtllm-engine, trtllm-checkpoint, vllm, …")
@click.option("--model", required=True, help="Model name, as recipes call it.")
@click.option("--gpu", help="GPU SKU (required for engines).")
@click.option("--quant", help="Quantization (bf16, fp8, int4_awq, …).")
@click.option("--kv-cache-dtype", help="KV-cache dtype (auto, fp8, int8).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor parallelism.")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline parallelism.")
@click.option("--shape", "shape_text", help="max_batch_size=N,max_input_len=N,max_seq_len=N")
@click.option("--ready", is_flag=True,
              help="Register as ready (you vouch it serves) instead of built.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def import_(directory: Path, kind: str, model: str, gpu: str | None, quant: str | None,
            kv_cache_dtype: str | None, tp: int | None, pp: int | None,
            shape_text: str | None, ready: bool, as_json: bool) -> None:
    """Adopt an engine or checkpoint DIRECTORY built elsewhere."""
    from registry.adopt import ImportSpec, import_artifact

    spec = ImportSpec(kind=kind, model=model, gpu=gpu, quant=quant,
                      kv_cache_dtype=kv_cache_dtype, tp=tp, pp=pp,
                      shape=_parse_shape(shape_text), status="ready" if ready else "built")
    result = import_artifact(_context(), directory, spec, progress=_progress())
    if as_json:
        _echo_json({"digest": result.digest, "registered": result.registered,
                    "blobs_uploaded": result.blobs_uploaded,
                    "bytes_uploaded": result.bytes_uploaded})
        return
    state = "imported" if result.registered else "already registered"
    click.echo(f"{state}: {result.digest} ({len(result.manifest.files)} files, "
               f"{result.manifest.size} bytes, {result.blobs_uploaded} new blobs)")


@main.command("ls")
@click.option("--model")
@click.option("--gpu")
@click.option("--kind")
@click.option("--quant")
@click.option("--status")
@click.option("--alias")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def ls_(as_json: bool, **filters: str | None) -> None:
    """List registered artifacts."""
    from registry.inventory import ls

    if filters.get("gpu"):
        from registry.gpus import UnknownGpuError, lookup_gpu

        try:
            filters["gpu"] = lookup_gpu(str(filters["gpu"])).sku
        except UnknownGpuError as exc:
            from registry.errors import UsageError

            raise UsageError(f"--gpu: {exc}") from exc
    rows = ls(_context(), **filters)
    if as_json:
        _echo_json(rows)
        return
    from pipeline.report import artifact_table

    click.echo(artifact_table(rows))


@main.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def show(ref: str, as_json: bool) -> None:
    """Show an artifact: manifest, provenance, aliases and smoke reports."""
    from registry.inventory import show as show_artifact

    info = show_artifact(_context(), ref)
    if as_json:
        _echo_json(info)
        return
    from pipeline.report import show_lines

    click.echo("\n".join(show_lines(info)))


@main.command()
@click.argument("ref")
@click.option("-o", "--output", "output", required=True,
              type=click.Path(path_type=Path, file_okay=False), help="Target directory.")
@click.option("--verify", type=click.Choice(["fast", "strict"]), default="fast",
              show_default=True, help="strict adds sha256 to xxh3-128.")
@click.option("--force", is_flag=True, help="Replace a non-empty target directory.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def fetch(ref: str, output: Path, verify: str, force: bool, as_json: bool) -> None:
    """Fetch REF (digest, 12+ hex prefix, or alias) into a directory, verified."""
    from registry.fetch import fetch as fetch_artifact

    result = fetch_artifact(_context(), ref, output, verify="strict" if verify == "strict"
                            else "fast", force=force, progress=_progress())
    if as_json:
        _echo_json({"digest": str(result.manifest.digest), "path": str(result.path),
                    "downloaded_bytes": result.downloaded_bytes,
                    "cached_bytes": result.cached_bytes})
        return
    click.echo(f"fetched {result.manifest.digest} into {result.path} "
               f"({result.downloaded_bytes} bytes downloaded, {result.cached_bytes} from cache)")


@main.command()
@click.argument("ref")
@click.argument("alias")
@click.option("--note", help="Why (kept in the alias history).")
@click.option("--allow-unready", is_flag=True,
              help="Tag a built (not yet smoke-tested) artifact; recorded in the history.")
@handle_errors
def tag(ref: str, alias: str, note: str | None, allow_unready: bool) -> None:
    """Point ALIAS at the artifact REF (only ready artifacts, unless overridden)."""
    from registry.aliases import tag as tag_artifact

    digest, previous = tag_artifact(_context(), ref, alias, note, allow_unready=allow_unready)
    moved = f" (was {previous})" if previous and previous != digest else ""
    click.echo(f"{alias} -> {digest}{moved}")


@main.command()
@click.argument("alias")
@handle_errors
def untag(alias: str) -> None:
    """Remove ALIAS (its history is kept)."""
    from registry.aliases import untag as untag_alias

    click.echo(f"removed {alias} (was {untag_alias(_context(), alias)})")


@main.command()
@click.option("--model", required=True)
@click.option("--gpu", required=True, help="GPU SKU, or 'auto' to read nvidia-smi.")
@click.option("--gpus", "gpu_count", type=click.IntRange(min=1),
              help="GPUs on the node (auto: counted).")
@click.option("--min-seq-len", type=click.IntRange(min=1))
@click.option("--min-batch", type=click.IntRange(min=1))
@click.option("--prefer", multiple=True, type=click.Choice(["engine", "checkpoint", "vllm"]),
              help="Kinds to try first, in order (repeatable).")
@click.option("--explain", is_flag=True, help="Say why every other artifact was rejected.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def resolve(model: str, gpu: str, gpu_count: int | None, min_seq_len: int | None,
            min_batch: int | None, prefer: tuple[str, ...], explain: bool,
            as_json: bool) -> None:
    """Rank the artifacts of a model for a GPU: engines, then checkpoints, then vLLM."""
    from registry.errors import RecordNotFoundError, UsageError
    from registry.gpus import UnknownGpuError, lookup_gpu
    from registry.resolve import Request, local_gpu
    from registry.resolve import resolve as rank_for

    if gpu == "auto":
        spec, counted = local_gpu()
        gpu_count = gpu_count or counted
    else:
        try:
            spec = lookup_gpu(gpu)
        except UnknownGpuError as exc:
            raise UsageError(f"--gpu: {exc}") from exc
    request = Request(model=model, gpu=spec, gpu_count=gpu_count, min_seq_len=min_seq_len,
                      min_batch=min_batch, prefer=prefer)
    ranked = rank_for(_context(), request, explain=explain)
    if as_json:
        _echo_json(ranked.as_dict())
    else:
        from pipeline.report import resolve_lines

        click.echo("\n".join(resolve_lines(ranked, explain)))
    if not ranked.candidates:
        raise RecordNotFoundError(
            "servable artifact for", f"{model} on {spec.sku}",
            hint="rerun with --explain to see why each artifact was rejected",
        )


@main.command()
@click.option("--no-verify", is_flag=True, help="Check presence only; do not re-hash blobs.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def fsck(no_verify: bool, as_json: bool) -> None:
    """Check every registered artifact's manifest and blobs; exit 4 on any problem."""
    from registry.errors import RegistryError
    from registry.fsck import fsck as check

    checked, problems = check(_context(), verify_blobs=not no_verify, progress=_progress())
    if as_json:
        _echo_json({"checked": checked, "problems": [str(p) for p in problems]})
    else:
        for problem in problems:
            click.echo(problem)
        click.echo(f"{checked} artifacts checked, {len(problems)} problems")
    if problems:
        raise RegistryError(f"fsck found {len(problems)} problems; first: {problems[0]}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--grace", default="7d", show_default=True,
              help="Keep blobs younger than this (e.g. 12h, 7d, 0s).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def gc(dry_run: bool, grace: str, as_json: bool) -> None:
    """Remove unreferenced blobs and the manifests of deleted artifacts."""
    from registry.gc import gc as collect

    result = collect(_context(), grace=_duration(grace), dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    if as_json:
        _echo_json({"dry_run": dry_run, "blobs": [str(b) for b in result.blobs],
                    "manifests": result.manifests, "bytes_freed": result.bytes_freed,
                    "unregistered_manifests": result.unregistered_manifests,
                    "partial_writes": result.partial})
        return
    click.echo(f"{verb} {len(result.blobs)} blobs ({result.bytes_freed} bytes), "
               f"{len(result.manifests)} manifests and {result.partial} partial writes")
    if result.unregistered_manifests:
        click.echo(f"kept {len(result.unregistered_manifests)} manifests the registry does not "
                   "list (and their blobs); `enginectl reindex` adopts them into an empty one")


def _duration(text: str) -> Any:
    import re
    from datetime import timedelta

    from registry.errors import UsageError

    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match is None:
        raise UsageError(f"--grace {text!r}: expected a number and a unit, e.g. 12h or 7d")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
    return timedelta(**{unit: int(match.group(1))})


@main.command()
@handle_errors
def reindex() -> None:
    """Rebuild an empty registry from the store's manifests."""
    from registry.reindex import reindex as rebuild

    click.echo(f"registered {rebuild(_context())} artifacts from the store")


@main.group()
def db() -> None:
    """The SQL registry's schema (Alembic migrations)."""


@db.command()
@handle_errors
def upgrade() -> None:
    """Migrate the registry to this enginectl's schema."""
    from registry.config import RegistryConfig
    from registry.db import safe_url
    from registry.db import upgrade as migrate

    url = RegistryConfig.from_env().registry_url
    click.echo(f"{safe_url(url)} is at revision {migrate(url)}")


@db.command()
@handle_errors
def current() -> None:
    """Print the registry's schema revision and this enginectl's."""
    from registry.config import RegistryConfig
    from registry.db import current as revision_of
    from registry.db import head_revision, safe_url

    url = RegistryConfig.from_env().registry_url
    click.echo(f"{safe_url(url)}: {revision_of(url) or 'empty'} "
               f"(this enginectl: {head_revision()})")


def entry() -> None:
    """The console script: click's own usage errors become one line and exit 2, too."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Abort:
        _fail("interrupted", 130)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # usage errors know their command
        where = f"{ctx.command_path}: " if ctx is not None else ""
        _fail(f"{where}{exc.format_message()} (see --help)", exc.exit_code)


if __name__ == "__main__":
    entry()
