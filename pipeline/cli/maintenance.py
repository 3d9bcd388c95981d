"""Commands that keep the store and registry whole: fsck, gc, reindex, db."""

from __future__ import annotations

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
    from registry.ops.fsck import fsck as check

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
              help="Keep blobs younger than this (e.g. 12h, 7d, 0s; at most 36500d).")
@click.option("--keep-superseded", type=click.IntRange(min=0), default=3, show_default=True,
              help="Per alias, keep this many artifacts it pointed at before (rollback "
                   "targets); superseded artifacts beyond them are deleted.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: what was (or would be) removed, and what was kept why.")
@handle_errors
def gc(dry_run: bool, grace: str, keep_superseded: int, as_json: bool) -> None:
    """Remove unreferenced blobs and the manifests of deleted artifacts.

    Kept always: blobs of artifacts not deleted (superseded ones only within
    --keep-superseded of an alias's history), of what each alias points at and pointed at
    within --keep-superseded, of publishes in progress and of manifests the registry
    lacks, and stage and smoke logs. Past the grace period it also removes what killed
    writers left and objects set aside under damaged/.

    \b
    Examples:
      enginectl gc --dry-run              # what a gc would remove now
      enginectl gc --grace 12h --json
    """
    from registry.ops.gc import gc as collect
    from registry.ops.gc import parse_grace

    result = collect(context(), grace=parse_grace(grace), dry_run=dry_run,
                     keep_superseded=keep_superseded)
    verb = "would remove" if dry_run else "removed"
    if as_json:
        echo_json({"dry_run": dry_run, "blobs": [str(b) for b in result.blobs],
                    "manifests": result.manifests, "bytes_freed": result.bytes_freed,
                    "unregistered_manifests": result.unregistered_manifests,
                    "partial_writes": result.partial, "damaged": result.damaged,
                    "expired_publishes": result.expired_publishes,
                    "kept_in_flight": result.kept_in_flight,
                    "kept_for_history": result.kept_for_history,
                    "retired": result.retired})
        return
    if result.retired:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {len(result.retired)} "
                   f"superseded artifacts past --keep-superseded {keep_superseded}")
    click.echo(f"{verb} {len(result.blobs)} blobs ({result.bytes_freed} bytes), "
               f"{len(result.manifests)} manifests, {result.partial} partial writes and "
               f"{len(result.damaged)} objects set aside as damaged")
    if result.unregistered_manifests:
        click.echo(f"kept {len(result.unregistered_manifests)} manifests the registry does not "
                   "list (and their blobs); `enginectl reindex` adopts them into an empty one")
    if result.kept_in_flight or result.kept_for_history:
        click.echo(f"kept {result.kept_in_flight} blobs of publishes in progress and "
                   f"{result.kept_for_history} that history references (logs, aliased once)")


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
    from registry.ops.reindex import reindex as rebuild

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
    """The SQL registry's schema (Alembic migrations).

    \b
    Examples:
      enginectl db current
      ENGINECTL_REGISTRY_URL=postgresql+psycopg://builder@db/enginectl enginectl db upgrade
    """


@db.command()
@handle_errors
def upgrade() -> None:
    """Create the registry, or migrate it to this enginectl's schema. Commands that only
    read (ls, show, resolve, pull, …) never do either and name this command instead; a
    PostgreSQL registry behind this enginectl is refused until it runs (a SQLite one, and an
    empty database, are migrated by the first command that writes).

    \b
    Examples:
      enginectl db upgrade
    """
    from registry.config import RegistryConfig, masked_url
    from registry.sql.schema import upgrade as migrate

    url = RegistryConfig.from_env().registry_url
    click.echo(f"{masked_url(url)} is at revision {migrate(url)}")


@db.command()
@handle_errors
def current() -> None:
    """Print the registry's schema revision and this enginectl's.

    \b
    Examples:
      enginectl db current
    """
    from registry.config import RegistryConfig, masked_url
    from registry.sql.schema import current as revision_of
    from registry.sql.schema import head_revision

    url = RegistryConfig.from_env().registry_url
    click.echo(f"{masked_url(url)}: {revision_of(url) or 'empty'} "
               f"(this enginectl: {head_revision()})")
