"""Commands that keep the store and registry whole: fsck, gc, reindex, db."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.base import context, echo_json, handle_errors, main, progress


@main.command()
@click.option("--no-verify", is_flag=True, help="Check presence only; do not re-hash blobs.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def fsck(no_verify: bool, as_json: bool) -> None:
    """Check every registered artifact's manifest and blobs; exit 4 on any problem."""
    from registry.errors import RegistryError
    from registry.fsck import fsck as check

    checked, problems = check(context(), verify_blobs=not no_verify, progress=progress())
    if as_json:
        echo_json({"checked": checked, "problems": [str(p) for p in problems]})
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

    result = collect(context(), grace=_duration(grace), dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    if as_json:
        echo_json({"dry_run": dry_run, "blobs": [str(b) for b in result.blobs],
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

    click.echo(f"registered {rebuild(context())} artifacts from the store")


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
