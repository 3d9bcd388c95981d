"""fetch, as `enginectl fetch` runs it: `registry.fetch.fetch` behind the one target rule.

    with Context() as ctx:
        fetched = fetch(ctx, "llama70b/h100/prod", "/models/llama70b", force=True)

The target is checked by `pipeline.deploy.guard.check_target` before anything is read
(`--force` replaces only a directory pull or fetch filled, or an empty one; never the store,
the cache, a home or the working directory), and the directory fetch filled gets the marker
that lets a later `fetch --force` replace it. An artifact that has a top-level file of the
marker's name keeps its own file; that directory is then not replaced by `--force`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.deploy.guard import MARKER, check_target, protected_places, write_marker
from registry.fetch import Fetched, Verify
from registry.fetch import fetch as fetch_artifact

if TYPE_CHECKING:
    from registry.context import Context
    from registry.progress import Progress


def fetch(ctx: Context, ref: str, dest: Path | str, *, verify: Verify = "fast",
          force: bool = False, allow_unready: bool = False,
          progress: Progress | None = None) -> Fetched:
    """Fetch *ref* into *dest* (`registry.fetch.fetch`), once the target rule allows it."""
    target = check_target(dest, force=force, verb="fetch", places=protected_places(ctx))
    fetched = fetch_artifact(ctx, ref, target, verify=verify, force=force,
                             allow_unready=allow_unready, progress=progress)
    entries = {entry.path.split("/", 1)[0] for entry in fetched.manifest.files}
    if MARKER not in entries:
        write_marker(fetched.path, by="fetch", digest=str(fetched.manifest.digest),
                     entries=entries)
    return fetched
