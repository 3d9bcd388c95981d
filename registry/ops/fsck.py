"""fsck: every registered artifact has its manifest and its blobs, and every digest matches.

Each unique blob is read once and re-hashed (xxh3-128) by streaming it from the store;
problems are collected so one run reports everything. Without `repair` nothing is changed.

With `repair`, what can be done here is done, and said:

- a manifest or a blob whose bytes fail their digest is set aside under `damaged/`, so the
  next publish of its content writes it again, only when the store vouches for the bad
  bytes (`registry.ops.damage.judge`: read back, they match the checksum the server stored,
  or the file store's file). A size the store reports that is not the manifest's (a
  HEAD's, a listing's) only sends the blob to be read back; when that hashes right, fails,
  or shows the bytes changed on the way, the size is still reported and the blob stays;
- a blob that is missing or was set aside is put back from this machine's fetch cache when
  the cache holds it (re-hashed first); otherwise publishing the same content again (an
  `enginectl import` of the source, or a rebuild) uploads it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from registry.errors import IntegrityError, ManifestError, NotFoundError
from registry.identity.digest import Digest, digest_file
from registry.identity.layout import blob_name
from registry.ops.damage import judge_object, set_aside, set_aside_damaged_manifest
from registry.ops.fetch import load_manifest
from registry.sql import records
from registry.sql.refit_evidence import refit_sources
from registry.workers import WORKERS, Workers

if TYPE_CHECKING:
    from registry.context import Context
    from registry.progress import Progress


@dataclass(frozen=True)
class Problem:
    digest: str  # the artifact
    what: str
    repaired: bool = False
    """True when `repair` put it right (a blob restored from the fetch cache)."""

    def __str__(self) -> str:
        return f"{self.digest}: {self.what}"


@dataclass
class Checked:
    checked: int = 0
    """Artifacts checked (every one that is not deleted, and the refit sources of stripped
    engines)."""
    problems: list[Problem] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    """What `repair` did, one line each."""

    @property
    def unrepaired(self) -> list[Problem]:
        return [p for p in self.problems if not p.repaired]


@dataclass
class _Blob:
    size: int
    users: list[tuple[str, str]] = field(default_factory=list)  # (artifact, path)


def fsck(ctx: Context, *, verify_blobs: bool = True, repair: bool = False,
         progress: Progress | None = None) -> Checked:
    """Check every artifact that is not deleted, and every checkpoint a weight-stripped
    engine that is not deleted is refitted from; with *repair*, fix what can be fixed."""
    result = Checked()
    with ctx.registry.session(readonly=True) as session:
        every = {r.digest: r for r in records.list_artifacts(session)}
        needed = refit_sources(session)
    artifacts = [r for r in every.values() if r.status != "deleted" or r.digest in needed]
    for source, engines in sorted(needed.items()):  # stripped engines serve only with these
        if source not in every:
            result.problems += [Problem(engine, f"its refit source {source} is not in the "
                                        "registry") for engine in engines]
    result.checked = len(artifacts)
    blobs = _manifests(ctx, artifacts, result, repair=repair)
    absent = ctx.store.missing_blobs({d: b.size for d, b in blobs.items()})
    broken: dict[Digest, str] = {}
    for digest in sorted(absent):
        held = ctx.store.has_blob(digest)
        broken[digest] = (f"blob {digest} has the wrong size in the store" if held
                          else f"blob {digest} is missing from the store")
        if repair and held:
            _set_aside_if_damaged(ctx, digest, None, result)
    if verify_blobs:
        present = sorted(set(blobs) - absent)
        for digest, error in zip(present, _verify(ctx, present, blobs, progress), strict=True):
            if error is None:
                continue
            broken[digest] = (f"blob bytes hash to {error.actual}, expected {error.expected}"
                              if error.actual is not None else f"blob {error.detail}")
            if repair:
                _set_aside_if_damaged(ctx, digest, error, result)
    for digest, what in sorted(broken.items()):
        restored = repair and _restore_from_cache(ctx, digest, blobs[digest].size, result)
        for artifact, path in blobs[digest].users:
            result.problems.append(Problem(artifact, f"{path}: {what}", repaired=restored))
    return result


def _manifests(ctx: Context, artifacts: list[records.ArtifactRecord], result: Checked, *,
               repair: bool) -> dict[Digest, _Blob]:
    """Load every manifest (a damaged one is set aside under *repair*); the blobs they use."""
    blobs: dict[Digest, _Blob] = {}
    for record in artifacts:
        try:
            manifest = load_manifest(ctx, record.digest)
        except (NotFoundError, IntegrityError, ManifestError) as exc:
            result.problems.append(Problem(record.digest, f"manifest: {exc}"))
            if repair and isinstance(exc, IntegrityError):
                aside = set_aside_damaged_manifest(ctx.store, Digest.parse(record.digest))
                if aside:
                    result.repairs.append(
                        f"moved the damaged manifest of {record.digest} to {aside}; publish "
                        "its content again (`enginectl import`, or rebuild) to restore it")
            continue
        listed = {(f.path, f.xxh3) for f in record.files}
        stored = {(f.path, str(f.xxh3)) for f in manifest.files}
        if listed != stored:
            result.problems.append(Problem(record.digest,
                                           "registry file list differs from manifest"))
        for entry in manifest.files:
            blobs.setdefault(entry.xxh3, _Blob(entry.size)).users.append(
                (record.digest, entry.path))
    return blobs


def _verify(ctx: Context, present: list[Digest], blobs: dict[Digest, _Blob],
            progress: Progress | None) -> list[IntegrityError | None]:
    if progress is not None:
        progress.start("verifying", sum(blobs[d].size for d in present))
    with tempfile.TemporaryDirectory(prefix="enginectl-fsck-") as scratch, \
            Workers(WORKERS, name="fsck") as pool:
        def check(digest: Digest) -> IntegrityError | None:
            target = Path(scratch) / digest.hex
            try:
                ctx.store.get_blob(digest, target, size=blobs[digest].size,
                                   progress=progress.advance if progress else None)
            except IntegrityError as exc:
                return exc
            target.unlink(missing_ok=True)
            return None

        found = list(pool.map(check, present))
    if progress is not None:
        progress.finish()
    return found


def _set_aside_if_damaged(ctx: Context, digest: Digest, first: IntegrityError | None,
                          result: Checked) -> None:
    """Set the blob aside when the store shows it damaged (*first*: the error of the read
    that found it, None when only its size was wrong); say what was done."""
    del first  # why it is asked, not a proof (`registry.ops.damage`)
    judgement = judge_object(ctx.store, blob_name(digest), digest)
    if judgement.verdict != "damaged":
        result.repairs.append(f"kept blob {digest}: not shown damaged by the store "
                              f"({judgement.why}); run `enginectl fsck` again")
        return
    aside = set_aside(ctx.store, blob_name(digest))
    if aside:
        result.repairs.append(f"moved the damaged blob {digest} to {aside}")


def _restore_from_cache(ctx: Context, digest: Digest, size: int, result: Checked) -> bool:
    """Put the blob back from the fetch cache, re-hashed first; whether it was."""
    if ctx.store.has_blob(digest):  # not set aside (the damage was not proven twice)
        return False
    entry = ctx.cache.verified(digest, size)
    if entry is None or digest_file(entry, with_sha256=False).xxh3 != digest:
        result.repairs.append(f"blob {digest} is not in this machine's fetch cache; publish "
                              "its content again (`enginectl import`, or rebuild) to restore it")
        return False
    ctx.store.put_blob(digest, entry)
    result.repairs.append(f"restored blob {digest} from the fetch cache ({entry})")
    return True
