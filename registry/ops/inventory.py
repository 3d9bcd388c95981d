"""ls and show: what the registry holds, with aliases, provenance and smoke reports.

`ls` reads on the database driver alone (`registry.sql.listing`), so it never imports
SQLAlchemy; a registry not at the schema head is refused as opening it for reading refuses
it. `show` reads on the driver too (`registry.sql.showing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from registry.errors import NoRegistryError, RecordNotFoundError

if TYPE_CHECKING:
    from registry.context import Context
    from registry.sql.lookup import DriverReader


def _not_made_yet(ctx: Context, exc: NoRegistryError) -> bool:
    """Whether *exc* says only that the embedded default registry (the SQLite file in the
    home, no ENGINECTL_REGISTRY_URL) was not made yet: nothing was built or imported, which
    `ls` and `show` answer as an empty registry. A registry the user configured that is not
    there stays an error (exit 4): that one is a typo or an outage."""
    return exc.missing and not _configured(ctx)


def _configured(ctx: Context) -> bool:
    """Whether the registry's URL was given (ENGINECTL_REGISTRY_URL), not the home's default."""
    return "ENGINECTL_REGISTRY_URL" in ctx.config.origins.get("registry_url", "")


def ls(ctx: Context, **filters: str | None) -> list[dict[str, Any]]:
    """Artifacts matching the filters (model, gpu, kind, quant, status, alias), oldest first,
    each with the GPUs its smoke runs passed on (`evidence`); none before the embedded
    default registry was made (`_not_made_yet`)."""
    from registry.config import check_directory
    from registry.sql.listing import listed_artifacts

    if not _configured(ctx):  # as opening the registry checks it (`Context.registry`)
        check_directory(ctx.config.home, what="enginectl's home", variable="ENGINECTL_HOME")
    try:
        return listed_artifacts(ctx.config.registry_url, retry_s=ctx.config.registry_retry_s,
                                **filters)
    except NoRegistryError as exc:
        if _not_made_yet(ctx, exc):
            return []
        raise


def show(ctx: Context, ref: str) -> dict[str, Any]:
    """Everything known about one artifact (`RecordNotFoundError` when there is none, also
    before the embedded default registry was made): its row, manifest, aliases (and the rollbacks
    that pin them: `pins`), smoke reports, its warm caches (`warm_caches`: where each was
    captured), and its provenance as a tree of input artifacts down to the source
    checkpoint. Read on the database driver alone (`registry.sql.showing`); a registry not at
    the schema head is refused as `ls` refuses it."""
    from registry.config import check_directory
    from registry.identity.refs import resolve_with
    from registry.ops.fetch import load_manifest
    from registry.sql import showing
    from registry.sql.listing import listed_rows, refuse_unless_head
    from registry.sql.lookup import open_reader

    if not _configured(ctx):  # as opening the registry checks it (`Context.registry`)
        check_directory(ctx.config.home, what="enginectl's home", variable="ENGINECTL_HOME")
    url = ctx.config.registry_url
    with open_reader(url, ctx.config.registry_retry_s) as reader:
        try:
            refuse_unless_head(reader, url)
        except NoRegistryError as exc:
            if _not_made_yet(ctx, exc):  # an empty registry: nothing is called *ref* (exit 6)
                raise RecordNotFoundError(
                    "artifact or alias", ref, hint="nothing was built or imported yet: "
                    "`enginectl build RECIPE` or `enginectl import DIR` adds one") from exc
            raise
        digest = resolve_with(ref, reader)
        row = listed_rows(reader, digest=digest)[0]  # resolve_with returns registered ones
        evidence = row.pop("evidence")
        aliases = row["aliases"]
        manifest = load_manifest(ctx, digest)
        run = showing.stage_run(reader, row["key"])
        return {
            "artifact": row,
            "manifest": manifest.as_dict(),
            "alias_history": showing.alias_history(reader, aliases),
            "pins": showing.rollback_pins(reader, aliases),
            "smoke_reports": showing.smoke_reports(reader, digest),
            "evidence": evidence,
            "provenance": _provenance(ctx, reader, manifest.inputs, seen={digest}),
            "warm_caches": showing.warm_caches(reader, row),
            "refit_equivalence": showing.refit_equivalence(reader, row),
            "stage_run": None if run is None else run | {"recipe_digest": row["recipe_digest"]},
        }


def _provenance(
    ctx: Context, reader: DriverReader, inputs: tuple[str, ...], seen: set[str]
) -> list[dict[str, Any]]:
    """Input artifacts, each with its own inputs, as far as the store has their manifests."""
    from registry.errors import NotFoundError
    from registry.ops.fetch import load_manifest
    from registry.sql.listing import listed_rows

    tree = []
    for digest in sorted(inputs):
        rows = listed_rows(reader, digest=digest)
        node: dict[str, Any] = {"digest": digest, "kind": rows[0]["kind"] if rows else None,
                                "key": rows[0]["key"] if rows else None}
        if digest not in seen:
            try:
                parents = load_manifest(ctx, digest).inputs
            except NotFoundError:
                parents = ()
            node["inputs"] = _provenance(ctx, reader, parents, seen | {digest})
        tree.append(node)
    return tree
