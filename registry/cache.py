"""The local blob cache: fetched file bytes keyed by their xxh3-128 digest.

A second fetch of the same content costs a re-hash and a hard link; an interrupted fetch
resumes with the blobs it had finished. Entries are written to a temp name and renamed into
place, then made read-only, so a crash never leaves a partial entry under a digest's name.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from registry.digest import Digest
from registry.filestore import remove_stale


class BlobCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: Digest) -> Path:
        return self.root / digest.algorithm / digest.hex[:2] / digest.hex[2:]

    def has(self, digest: Digest, size: int) -> bool:
        try:
            return self.path(digest).stat().st_size == size
        except FileNotFoundError:
            return False

    def fill(self, digest: Digest, write: Callable[[Path], None]) -> Path:
        """Run *write(temp_path)* (which must verify what it writes), then publish the entry."""
        final = self.path(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.parent / f".tmp-{uuid.uuid4().hex}"
        try:
            write(temp)
            temp.chmod(0o444)
            temp.replace(final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        return final

    def evict(self, digest: Digest) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def remove_partial(self, before: datetime, *, dry_run: bool = False) -> int:
        """Temp entries (`.tmp-*`) of fills killed before *before*: a fetch that was
        interrupted resumes from its finished entries, never from these."""
        return remove_stale(self.root.glob("*/*/.tmp-*"), before, dry_run=dry_run)
