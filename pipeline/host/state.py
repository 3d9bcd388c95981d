"""The files a build remembers between runs (`pipeline.planning.plan_cache`, the vLLM probe of
`pipeline.host.runtimes.remembered_vllm_in`): each written whole or not at all, so a reader
finds the old file, the new one, or none."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """*data* as *path*'s whole content, by a rename over it (its directory made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        Path(name).replace(path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
