"""Commands that keep the store and registry whole: fsck, gc, reindex, db."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.base import context, echo_json, handle_errors, main, progress


@main.command()
@click.option("--no-verify", is_flag=True, help="Check presence and sizes only; do not re-hash "
              "blobs.")
@click.option("--repair", is_flag=True,
              help="Move damaged blobs and manifests aside (damaged/ in the store) so the next "
                   "publish of their content heals them, and put missing blobs back from "
                   "this machine's fetch cache; every action is printed.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: checked, problems, repairs, unrepaired.")
@handle_errors
def fsck(no_verify: bool, repair: bool, as_json: bool) -> None:
    """Check every registered artifact's manifest and blobs; exit 4 on any problem left.

    \b
    Examples:
      enginectl fsck                 # re-hash every blob of every artifact
      enginectl fsck --no-verify     # presence and sizes only (quick)
      enginectl fsck --repair        # set damage aside, restore from the cache, say what
    """
    from registry.errors import RegistryError
    from registry.fsck import fsck as check

    found = check(context(), verify_blobs=not no_verify, repair=repair, progress=progress())
    left = found.unrepaired
    if as_json:
        echo_json({"checked": found.checked, "problems": [str(p) for p in found.problems],
                   "repairs": found.repairs, "unrepaired": [str(p) for p in left]})
    else:
        for problem in found.problems:
            click.echo(f"{problem}{' (repaired)' if problem.repaired else ''}")
        for line in found.repairs:
            click.echo(f"repair: {line}")
        click.echo(f"{found.checked} artifacts checked, {len(found.problems)} problems"
                   + (f", {len(found.problems) - len(left)} repaired" if repair else ""))
    if left:
        hint = ("publish the damaged content again, then run `enginectl fsck`" if repair
                else "run `enginectl fsck --repair`")
        raise RegistryError(f"fsck found {len(left)} problems; first: {left[0]}; {hint}")


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
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: artifacts, statuses, smoke_reports, aliases, "
                   "alias_moves, problems.")
@handle_errors
def reindex(as_json: bool) -> None:
    """Rebuild an empty registry from the store: artifacts, statuses, smoke reports and
    aliases with their history. A bad manifest or record is skipped and reported; exit 4
    at the end with their count.

    \b
    Examples:
      ENGINECTL_REGISTRY_URL=sqlite:////tmp/new.db enginectl reindex
      mv ~/.local/share/enginectl/registry.db{,.damaged} && enginectl reindex
    """
    from registry.errors import RegistryError
    from registry.reindex import reindex as rebuild

    done = rebuild(context())
    if as_json:
        echo_json({"artifacts": done.artifacts, "statuses": done.statuses,
                   "smoke_reports": done.smoke_reports, "aliases": done.aliases,
                   "alias_moves": done.alias_moves, "problems": done.problems})
    else:
        for problem in done.problems:
            click.echo(f"skipped: {problem}")
        click.echo(f"registered {done.artifacts} artifacts from the store ({done.statuses} "
                   f"with a recorded status), {done.smoke_reports} smoke reports, "
                   f"{done.aliases} aliases ({done.alias_moves} moves of history)")
    if done.problems:
        raise RegistryError(f"reindex skipped {len(done.problems)} bad objects; first: "
                            f"{done.problems[0]}; `enginectl fsck` after publishing them again")


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
