"""fetch, as `enginectl fetch` runs it: `registry.ops.fetch` behind the one target rule, filled
the way pull fills a directory.

    with Context() as ctx:
        fetched = fetch(ctx, "llama70b/h100/prod", "/models/llama70b", force=True)

The target is checked by `pipeline.deploy.guard.check_dest` before anything is read
(`--force` replaces only a directory pull or fetch filled, or an empty one; never the store,
the cache, a home or the working directory). The artifact (`registry.ops.fetch.choose`) is then
placed by `registry.ops.fetch_files.fetch_manifest` into `pipeline.deploy.dest.staged`, as pull's
files are: a staging directory renamed into place or, for a mount point (a Kubernetes
volume, which cannot be renamed over), filled in place behind the marker, so a fetch killed
half way does not block the next one. The directory gets the marker (by "fetch") that lets
a later `fetch --force` replace it. An artifact that has a top-level file of the marker's
name keeps its own file; that directory is then not replaced by `--force`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.deploy.dest import staged
from pipeline.deploy.guard import MARKER, check_dest, protected_places
from registry.ops.fetch import choose, lazy_store
from registry.ops.fetch_files import Fetched, Verify, fetch_manifest

if TYPE_CHECKING:
    from registry.context import Context
    from registry.progress import Progress


def fetch(ctx: Context, ref: str, dest: Path | str, *, verify: Verify = "fast",
          force: bool = False, allow_unready: bool = False,
          progress: Progress | None = None) -> Fetched:
    """Fetch *ref* into *dest* once the target rule allows it (module doc)."""
    target = check_dest(dest, force=force, verb="fetch", places=protected_places(ctx))
    chosen = choose(ctx, ref, allow_unready=allow_unready)
    manifest = chosen.manifest
    entries = {entry.path.split("/", 1)[0] for entry in manifest.files}
    with staged(target, digest=str(manifest.digest), by="fetch",
                mark=MARKER not in entries) as tree:
        fetched = fetch_manifest(lazy_store(ctx), manifest, tree, cache=ctx.cache,
                                 verify=verify, progress=progress,
                                 protect=[("enginectl's home", ctx.config.home)],
                                 named=target)
    return replace(fetched, path=target, notes=chosen.notes)
