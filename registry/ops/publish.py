"""publish: a directory becomes an artifact — blobs first, then the manifest, then one
registry transaction.

A crash at any point leaves no visible half-artifact: blobs without a manifest are
unreferenced (gc removes them after the grace period), a manifest without a registry row is
complete (reindex adopts it), and the registry row is written last, in one transaction.
Publishing the same content twice is a no-op; identical files are stored once.

`Publication` is one publish as public phases, in order:

    prepare         hash the files, make the manifest and the row (nothing is written)
    begin           record the blobs it relies on as a pending publish (gc keeps them)
    upload          put the blobs the store lacks, or holds at another size
    write_manifest  put the manifest (a stored one is compared, and replaced if damaged)
    commit          under the gc lock (shared): every blob and the manifest are there, put
                    back any that gc removed; register; drop the pending row. A pending row
                    lost meanwhile (`Pending.lost`: gc removed it, or no renewal got through
                    in time) has every blob the manifest names checked again and uploaded
                    again from its file; one that cannot be fails the publish (exit 4),
                    nothing registered

so tests can run gc between any two of them (`registry.ops.pending` says why nothing it relies on
can be lost). `run` does them in that order except that it hashes xxh3-128 first, all that
`begin` and `upload` need, and lets the sha256, which only the manifest needs, run on
background threads beside the upload (`digest_tree`); `prepare` then waits for it.
A blob that exists is trusted only at its size; a stored manifest is always compared.
Publishing content whose artifact is `deleted` brings it back with the status asked for.
Ctrl-C while uploading raises StoppedError: the blobs already uploaded stay, and a re-run
uploads only the rest.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from registry.errors import ManifestError, RegistryError, StoppedError
from registry.identity.digest import Digest, FileDigests, digest_file
from registry.identity.manifest import FILL_MARKER, FileEntry, Manifest, check_path
from registry.progress import NoProgress, Progress
from registry.workers import WORKERS, Workers

if TYPE_CHECKING:
    from registry.context import Context
    from registry.ops.pending import Pending
    from registry.sql.records import ArtifactKind, ArtifactRecord, ArtifactStatus


def scan_directory(root: Path) -> list[tuple[str, Path]]:
    """Every regular file under *root* as (relative POSIX path, path), sorted; a fill marker
    at the top (`manifest.FILL_MARKER`) is not the artifact's.

    Links, devices, sockets and FIFOs are refused: an artifact is plain files."""
    if not root.is_dir():
        raise ManifestError(f"{root} is not a directory")
    found: list[tuple[str, Path]] = []
    for directory, subdirs, files in os.walk(root, followlinks=False):
        for name in sorted(subdirs + files):
            path = Path(directory) / name
            mode = path.lstat().st_mode
            relative = path.relative_to(root).as_posix()
            try:
                relative.encode("utf-8")
            except UnicodeEncodeError:
                raise ManifestError(
                    f"file name {os.fsencode(relative)!r} under {root} is not valid UTF-8; "
                    "rename it (manifests hold UTF-8 paths)") from None
            if stat.S_ISLNK(mode):
                raise ManifestError(f"{relative!r} is a symbolic link; artifacts hold plain files")
            if stat.S_ISREG(mode):
                if relative != FILL_MARKER:
                    found.append((check_path(relative), path))
            elif not stat.S_ISDIR(mode):
                raise ManifestError(f"{relative!r} is not a regular file")
    return sorted(found)


def digest_directory(root: Path, progress: Progress | None = None) -> list[tuple[FileEntry, Path]]:
    """xxh3-128 and sha256 of every file, in parallel."""
    files = scan_directory(root)
    progress = progress or NoProgress()
    progress.start("hashing", sum(path.stat().st_size for _, path in files))

    def one(item: tuple[str, Path]) -> tuple[FileEntry, Path]:
        relative, path = item
        digests = digest_file(path)
        progress.advance(digests.size)
        assert digests.sha256 is not None  # noqa: S101 - digest_file computes it by default
        return FileEntry(relative, digests.size, digests.xxh3, digests.sha256), path

    with Workers(WORKERS, name="hash") as pool:
        result = list(pool.map(one, files))
    progress.finish()
    return result


@dataclass(frozen=True)
class TreeDigests:
    """A tree's files with their sizes and xxh3-128 (the blob keys: all an upload needs),
    and futures of their full digests (the sha256 is the manifest's), hashed on background
    threads while the blobs upload: sha256 is ~7x the cost of xxh3 (bench/verify_speed.py),
    so it no longer waits in front of the upload."""

    files: list[tuple[str, Path, FileDigests]]
    full: list[Future[FileDigests]]

    @property
    def sources(self) -> dict[Digest, Path]:
        return {quick.xxh3: path for _, path, quick in self.files}

    def entries(self) -> list[tuple[FileEntry, Path]]:
        """Every file's entry, once its sha256 is there; a file whose bytes changed between
        the two reads is refused (what was uploaded would not be what the manifest says)."""
        entries = []
        for (relative, path, quick), future in zip(self.files, self.full, strict=True):
            full = future.result()
            if (full.size, full.xxh3) != (quick.size, quick.xxh3) or full.sha256 is None:
                raise ManifestError(f"{relative!r} changed while it was published; publish it "
                                    "again once nothing writes to it")
            entries.append((FileEntry(relative, full.size, full.xxh3, full.sha256), path))
        return entries


def digest_tree(root: Path, progress: Progress | None = None) -> TreeDigests:
    """xxh3-128 of every file now (in parallel, with progress), sha256 on daemon threads
    that run on while the caller uploads (a Ctrl-C never waits for them)."""
    files = scan_directory(root)
    progress = progress or NoProgress()
    progress.start("hashing", sum(path.stat().st_size for _, path in files))

    def one(item: tuple[str, Path]) -> tuple[str, Path, FileDigests]:
        relative, path = item
        digests = digest_file(path, with_sha256=False)
        progress.advance(digests.size)
        return relative, path, digests

    with Workers(WORKERS, name="hash") as pool:
        quick = list(pool.map(one, files))
    progress.finish()
    later = Workers(WORKERS, name="sha256")
    full = [later.submit(digest_file, path) for _, path, _ in quick]
    later.shutdown(wait=False)  # the queued files are still hashed; nothing waits for it
    return TreeDigests(quick, full)


LABEL_COLUMNS = (
    "runtime", "gpu", "sm", "quant", "kv_cache_dtype", "max_batch_size", "max_input_len",
    "max_seq_len", "max_num_tokens",
)


def record_of(
    manifest: Manifest,
    *,
    status: ArtifactStatus,
    status_reason: str | None = None,
    recipe_digest: str | None = None,
) -> ArtifactRecord:
    """The registry row for *manifest*: labels become columns, files become file rows."""
    from registry.sql.records import ArtifactRecord, FileRecord

    labels = dict(manifest.labels)
    return ArtifactRecord(
        digest=str(manifest.digest),
        kind=cast("ArtifactKind", manifest.kind),
        model=str(labels["model"]),
        size=manifest.size,
        file_count=len(manifest.files),
        status=status,
        status_reason=status_reason,
        key=manifest.key,
        tp=int(labels.get("tp", 1)),
        pp=int(labels.get("pp", 1)),
        toolchain=dict(manifest.toolchain),
        labels=labels,
        recipe_digest=recipe_digest,
        files=tuple(
            FileRecord(f.path, f.size, str(f.xxh3), str(f.sha256)) for f in manifest.files
        ),
        **{name: labels.get(name) for name in LABEL_COLUMNS},
    )


@dataclass(frozen=True)
class Published:
    digest: str
    manifest: Manifest
    registered: bool  # False: the registry already had it (a no-op publish)
    blobs_uploaded: int
    bytes_uploaded: int


@dataclass(frozen=True)
class PublishSpec:
    """What a publish says of an artifact besides its files: the manifest's fields, and
    the status its registry row starts with."""

    kind: str
    labels: Mapping[str, Any]
    status: ArtifactStatus = "built"
    status_reason: str | None = None
    recipe_digest: str | None = None
    key: str | None = None
    toolchain: Mapping[str, Any] | None = None
    inputs: tuple[str, ...] = ()
    serve: Mapping[str, Any] | None = None


class Publication:
    """One publish of *root* as *spec* says (see the module doc); `run` does every phase.
    *hashed*: the files' entries, when the caller hashed them already."""

    def __init__(self, ctx: Context, root: Path, spec: PublishSpec, *,
                 progress: Progress | None = None,
                 hashed: list[tuple[FileEntry, Path]] | None = None) -> None:
        if "model" not in spec.labels:
            raise ManifestError("an artifact needs a 'model' label")
        self.ctx, self.root, self.spec = ctx, root, spec
        self.progress = progress or NoProgress()
        self.hashed = hashed
        self.tree: TreeDigests | None = None
        self.stop = threading.Event()
        self.manifest: Manifest | None = None
        self.record: ArtifactRecord | None = None
        self.sources: dict[Digest, Path] = {}
        self.pending: Pending | None = None
        self.bytes_uploaded = 0

    def _keys(self) -> None:
        """Sizes and xxh3-128 of the files (what `begin` and `upload` need); their sha256
        goes on in the background until `prepare` needs it."""
        if self.hashed is None and self.tree is None:
            self.tree = digest_tree(self.root, self.progress)
            self.sources = self.tree.sources

    def prepare(self) -> Manifest:
        if self.hashed is not None:
            entries = self.hashed
        else:
            self._keys()
            assert self.tree is not None  # noqa: S101 - set by _keys
            entries = self.tree.entries()
        spec = self.spec
        self.manifest = Manifest(
            kind=spec.kind, files=tuple(entry for entry, _ in entries),
            labels={k: v for k, v in spec.labels.items() if v is not None},
            key=spec.key, toolchain=dict(spec.toolchain or {}), inputs=spec.inputs,
            serve=spec.serve,
        )
        self.sources = {entry.xxh3: path for entry, path in entries}
        self.record = record_of(self.manifest, status=spec.status,
                                status_reason=spec.status_reason,
                                recipe_digest=spec.recipe_digest)
        return self.manifest

    def begin(self, *, ttl: timedelta | None = None) -> None:
        """*ttl*: how long the pending row lasts unless renewed
        (`registry.sql.pending_publishes.TTL`)."""
        from registry.ops.pending import Pending
        from registry.sql.pending_publishes import TTL

        self.pending = Pending.begin(self.ctx, self.sources, ttl=ttl or TTL)

    def upload(self) -> None:
        assert self.pending is not None, "begin() first"  # noqa: S101 - phase order
        self.bytes_uploaded = self.pending.upload(progress=self.progress, stop=self.stop)

    def write_manifest(self) -> None:
        """Put the manifest under the gc lock (shared): no sweep runs while its temp file
        (a file store's) exists, so a gc with no grace never takes it mid-write."""
        assert self.manifest is not None, "prepare() first"  # noqa: S101 - phase order
        with self.ctx.registry.gc_lock(shared=True):
            self._put_manifest()

    def _put_manifest(self) -> None:
        assert self.manifest is not None, "prepare() first"  # noqa: S101 - phase order
        self.ctx.store.put_manifest(self.manifest.digest, self.manifest.to_bytes())

    def commit(self) -> Published:
        from registry.ops import history
        from registry.sql import records
        from registry.sql.tables import utcnow

        assert self.pending is not None, "begin() first"  # noqa: S101 - phase order
        assert self.manifest is not None, "prepare() first"  # noqa: S101 - phase order
        assert self.record is not None  # noqa: S101 - set with the manifest
        record = replace(self.record, created_at=utcnow())
        with self.pending.committing(also=self._before_registering) as session:
            registered = records.add_artifact_if_absent(session, record)
            if registered:
                history.record_registered(self.ctx.store, record)
            elif records.get_status(session, record.digest) == "deleted":
                history.set_status_and_record(self.ctx.store, session, record.digest,
                                              self.spec.status,
                                              "published again after it was deleted")
        uploaded = self.pending.uploaded
        return Published(record.digest, self.manifest, registered, len(uploaded),
                         self.bytes_uploaded)

    def _before_registering(self) -> None:
        """Under the gc lock, before the pending publish's own check (`Pending.restore`)."""
        assert self.pending is not None  # noqa: S101 - commit checked it
        if self.pending.lost is not None:
            self._blobs_again(self.pending.lost)
        self._manifest_again()

    def _blobs_again(self, lost: str) -> None:
        """The pending row was lost, so gc may have taken any blob: every blob the manifest
        names is checked (at its size) and one that is gone is uploaded again from its file
        (its digest checked as it goes); if one cannot be, nothing is registered."""
        assert self.manifest is not None  # noqa: S101 - commit checked it
        sizes = {entry.xxh3: entry.size for entry in self.manifest.files}
        for digest in sorted(self.ctx.store.missing_blobs(sizes)):
            source = self.sources.get(digest)
            try:
                if source is None:
                    raise FileNotFoundError(f"no file of {self.root} holds it")
                self.ctx.store.put_blob(digest, source)
            except (OSError, RegistryError) as exc:
                why = " ".join(f"{exc}".split())[:300]
                raise RegistryError(
                    f"{self.root} was not published: {lost}, blob {digest} is no longer in "
                    f"{self.ctx.store.url} and could not be uploaded again ({why}); run the "
                    "same command again") from exc

    def _manifest_again(self) -> None:
        """Under the gc lock: gc removes only the manifests of deleted artifacts, so only
        when reviving one can the manifest written before be gone."""
        from registry.sql import records

        assert self.record is not None  # noqa: S101 - set with the manifest
        with self.ctx.registry.connection(readonly=True) as session:
            deleted = records.get_status(session, self.record.digest) == "deleted"
        if deleted:
            self._put_manifest()  # the lock is held: taking it again could wait on gc

    def abort(self) -> None:
        """Drop the pending row of a publish that will not commit (its blobs stay for gc)."""
        if self.pending is not None:
            self.pending.end()

    def run(self) -> Published:
        """The phases, with the sha256 of the files (only the manifest needs it) hashed
        while the blobs upload, unless the caller hashed them already."""
        if self.hashed is None:
            self._keys()
        else:
            self.prepare()
        self.begin()
        try:
            self.upload()
            if self.manifest is None:
                self.prepare()
            self.write_manifest()
            published = self.commit()
        except KeyboardInterrupt as exc:
            self.stop.set()
            self.progress.finish()
            self.abort()
            have = len(self.sources) - len(self.ctx.store.missing_blobs(
                {d: p.stat().st_size for d, p in self.sources.items()}))
            raise StoppedError(
                f"interrupted: nothing was registered; {have} of {len(self.sources)} blobs of "
                f"{self.root} are in {self.ctx.store.url}; run the same command again to "
                "upload only the rest") from exc
        except BaseException:
            self.stop.set()
            self.abort()
            raise
        if self.pending is not None:
            self.pending.end()
        return published


def publish(
    ctx: Context,
    root: Path | str,
    *,
    kind: str,
    labels: Mapping[str, Any],
    status: ArtifactStatus = "built",
    status_reason: str | None = None,
    recipe_digest: str | None = None,
    progress: Progress | None = None,
    **manifest_fields: Any,
) -> Published:
    """Store *root* as an artifact and register it; a no-op for content already there."""
    spec = PublishSpec(kind, labels, status, status_reason, recipe_digest, **manifest_fields)
    return Publication(ctx, Path(root), spec, progress=progress).run()
