"""fsck: every registered artifact has its manifest and its blobs, and every digest matches.

Each unique blob is read once and re-hashed (xxh3-128) by streaming it from the store;
problems are collected, never fixed silently, so one run reports everything.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from registry import records
from registry.digest import Digest
from registry.errors import IntegrityError, ManifestError, NotFoundError
from registry.fetch import load_manifest
from registry.store import WORKERS

if TYPE_CHECKING:
    from registry.context import Context
    from registry.progress import Progress


@dataclass(frozen=True)
class Problem:
    digest: str  # the artifact
    what: str

    def __str__(self) -> str:
        return f"{self.digest}: {self.what}"


def fsck(ctx: Context, *, verify_blobs: bool = True,
         progress: Progress | None = None) -> tuple[int, list[Problem]]:
    """(artifacts checked, problems found) over every artifact that is not deleted."""
    problems: list[Problem] = []
    with ctx.registry.session(readonly=True) as session:
        artifacts = [r for r in records.list_artifacts(session) if r.status != "deleted"]
    users: dict[Digest, list[tuple[str, str]]] = {}
    sizes: dict[Digest, int] = {}
    for record in artifacts:
        try:
            manifest = load_manifest(ctx, record.digest)
        except (NotFoundError, IntegrityError, ManifestError) as exc:
            problems.append(Problem(record.digest, f"manifest: {exc}"))
            continue
        listed = {(f.path, f.xxh3) for f in record.files}
        stored = {(f.path, str(f.xxh3)) for f in manifest.files}
        if listed != stored:
            problems.append(Problem(record.digest, "registry file list differs from manifest"))
        for entry in manifest.files:
            users.setdefault(entry.xxh3, []).append((record.digest, entry.path))
    sizes = dict.fromkeys(users, 0)
    missing = ctx.store.missing_blobs(users)
    for digest in sorted(missing):
        for artifact, path in users[digest]:
            problems.append(Problem(artifact, f"{path}: blob {digest} is missing from the store"))
    if verify_blobs:
        present = sorted(set(users) - missing)
        if progress is not None:
            progress.start("verifying", sum(sizes[d] for d in present))
        with tempfile.TemporaryDirectory(prefix="enginectl-fsck-") as scratch, \
                ThreadPoolExecutor(WORKERS) as pool:
            def check(digest: Digest) -> IntegrityError | None:
                target = Path(scratch) / digest.hex
                try:
                    ctx.store.get_blob(digest, target,
                                       progress=progress.advance if progress else None)
                except IntegrityError as exc:
                    return exc
                target.unlink(missing_ok=True)
                return None

            for digest, error in zip(present, pool.map(check, present), strict=True):
                if error is not None:
                    for artifact, path in users[digest]:
                        problems.append(Problem(
                            artifact, f"{path}: blob bytes hash to {error.actual}, "
                                      f"expected {error.expected}"))
        if progress is not None:
            progress.finish()
    return len(artifacts), problems
