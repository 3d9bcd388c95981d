"""Placing a fetched artifact's files: where they may go, then all or nothing.

Blobs come through the local cache (parallel downloads, verified with xxh3-128 while
streaming), then are placed (`fill`) into the tree of a placement (`registry.ops.placement`),
which is put at the target only when every file checked out; `strict` re-hashes every placed
file with xxh3-128 and sha256, cache hits included. A failure leaves the target as it was. A
target is never one of `protected_places`, nor a folder above one, nor in a view of the
kernel (`registry.ops.target.check_dest_place`).

What to fetch (a ref, its manifest, its status) is decided before, by `registry.ops.fetch`.
`fetch_once` places a directory that several processes of one machine share, once.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from registry.errors import (
    DiskFullError,
    IntegrityError,
    ManifestError,
    StoppedError,
    UsageError,
)
from registry.filelock import flock
from registry.identity.digest import Digest, digest_file
from registry.identity.layout import blob_name
from registry.identity.manifest import FileEntry, Manifest
from registry.ops.damage import read_failure
from registry.ops.placement import clear_abandoned, placing
from registry.ops.target import Target, base_places, check_dest_place
from registry.progress import NoProgress, Progress
from registry.store.base import Store
from registry.store.cache import BlobCache
from registry.workers import WORKERS, Workers

Verify = Literal["fast", "strict"]
INSIDE_REFUSED: Final = ("the store", "the fetch cache")
"""Places a library fetch's target may not lie inside (the commands' rule adds older caches
and enginectl's home: `registry.ops.target.INSIDE_REFUSED`)."""


@dataclass(frozen=True)
class Fetched:
    manifest: Manifest
    path: Path
    downloaded_bytes: int
    cached_bytes: int
    notes: tuple[str, ...] = ()
    """What the caller should tell the user (the CLI prints them on stderr): an artifact
    fetched before it was proven to serve, or one fetched despite its status."""


def protected_places(store: Store, cache: BlobCache,
                     extra: Iterable[tuple[str, Path]] = ()) -> list[tuple[str, Path]]:
    """What a fetch (or pull) target may never be, nor be a folder above
    (`registry.ops.target.base_places`): `/`, the working directory, the user's home, the
    store (`file://`) and the cache, plus *extra* (enginectl's home)."""
    root = getattr(store, "root", None)
    return base_places(cache.root, cache.legacy, root if isinstance(root, Path) else None,
                       extra)


def _inside(root: Path, relative: str) -> Path:
    """Where *relative* goes under *root*; never outside it (manifests are checked on parse,
    this is the second lock)."""
    target = root.joinpath(*relative.split("/"))
    if not target.resolve().is_relative_to(root.resolve()):
        raise ManifestError(f"file path {relative!r} leaves the target directory")
    return target


def _strict(path: Path, entry: FileEntry) -> None:
    """`--verify strict` of a placed file: xxh3-128 and sha256 (a hard link to a cache entry,
    or a copy enginectl just made, so it is hashed through mmap)."""
    found = digest_file(path, mapped=True)
    if found.xxh3 != entry.xxh3:
        raise IntegrityError(entry.path, expected=entry.xxh3, actual=found.xxh3)
    if found.sha256 is not None and found.sha256 != entry.sha256:  # always set: with_sha256
        raise IntegrityError(entry.path, expected=entry.sha256, actual=found.sha256)


class _Run:
    """One fetch's moving parts, shared by its worker threads."""

    def __init__(self, store: Store, manifest: Manifest, cache: BlobCache,
                 progress: Progress) -> None:
        self.store, self.manifest, self.cache, self.progress = store, manifest, cache, progress
        self.by_digest = {entry.xxh3: entry for entry in manifest.files}
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.downloaded = 0

    def download(self, digest: Digest) -> None:
        entry = self.by_digest[digest]
        try:
            self.cache.fill(digest, lambda temp: self.store.get_blob(
                digest, temp, size=entry.size, progress=self.progress.advance, stop=self.stop))
        except IntegrityError as exc:  # damaged, or corrupted on the way: judged there
            raise read_failure(self.store, blob_name(digest), entry.path, exc) from exc
        with self._lock:
            self.downloaded += entry.size

    def place(self, entry: FileEntry, staging: Path, *, cached: bool, verify: Verify) -> None:
        target = _inside(staging, entry.path)
        if not self.cache.place(entry.xxh3, target):
            # changed since it was verified (someone edited a fetched copy): fetch it again
            self.download(entry.xxh3)
            if not self.cache.place(entry.xxh3, target):
                raise IntegrityError(str(self.cache.path(entry.xxh3)), expected=entry.xxh3,
                                     actual=None, detail="a cache entry that keeps changing")
        if verify == "strict":
            try:
                _strict(target, entry)
            except IntegrityError:
                self.cache.evict(entry.xxh3)
                raise
        if cached:
            self.progress.advance(entry.size)

    def kept(self) -> str:
        """For the message of an interrupted fetch: what the cache holds of this artifact."""
        have = [d for d in self.by_digest if self.cache.path(d).is_file()]
        size = sum(self.by_digest[d].size for d in have)
        return (f"{len(have)} of {len(self.by_digest)} blobs ({size} of "
                f"{self.manifest.size} bytes) are in the cache {self.cache.root}")


def fill(
    store: Store,
    manifest: Manifest,
    tree: Path,
    *,
    cache: BlobCache,
    verify: Verify = "fast",
    progress: Progress | None = None,
    named: Path | None = None,
) -> Fetched:
    """Put *manifest*'s files in *tree* (absent, or an empty directory: a `placing` tree),
    through the cache, verified. Ctrl-C (KeyboardInterrupt) stops every transfer at its next
    chunk and raises StoppedError saying what the cache kept and that *named* (the
    directory the user asked for) was left as it was; a full disk is DiskFullError."""
    run = _Run(store, manifest, cache, progress or NoProgress())
    pool = Workers(WORKERS, name="fetch")
    try:
        found = list(pool.map(lambda d: cache.verified(d, run.by_digest[d].size) is not None,
                              run.by_digest))
        cached = {d for d, ok in zip(run.by_digest, found, strict=True) if ok}
        missing = [d for d in run.by_digest if d not in cached]
        run.progress.start("fetching", manifest.size)
        list(pool.map(run.download, missing))
        tree.mkdir(parents=True, exist_ok=True)
        try:
            list(pool.map(lambda e: run.place(e, tree, cached=e.xxh3 in cached,
                                              verify=verify), manifest.files))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(named or tree, "the target directory") from exc
            raise
    except KeyboardInterrupt as exc:
        run.stop.set()  # in-flight reads end at their next chunk; daemon threads never wait
        pool.shutdown(wait=False, cancel_futures=True)
        run.progress.finish()
        raise StoppedError(f"interrupted: {named or tree} was left as it was; {run.kept()}; "
                           "run the same fetch again to resume from them") from exc
    except BaseException:
        run.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # nothing writes into the tree after
        raise
    finally:
        run.progress.finish()
    pool.shutdown()
    return Fetched(manifest, named or tree, run.downloaded, manifest.size - run.downloaded)


def fetch_manifest(
    store: Store,
    manifest: Manifest,
    dest: Path | str,
    *,
    cache: BlobCache,
    verify: Verify = "fast",
    progress: Progress | None = None,
    protect: Iterable[tuple[str, Path]] = (),
) -> Fetched:
    """Materialise *manifest* at *dest*, absent or empty, all or nothing
    (`registry.ops.placement`; no marker: a directory of enginectl's own, a build's inputs
    or a smoke's model) and never one of `protected_places` (or above one)."""
    dest = check_dest_place(Path(dest), protected_places(store, cache, protect), "fetch",
                            INSIDE_REFUSED)
    clear_abandoned(dest)  # first: it may put back what a killed fill had set aside
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise UsageError(f"{dest} is not empty; fetch into an empty directory")
    with placing(Target(dest), by="fetch", digest=str(manifest.digest), mark=False) as placed:
        return fill(store, manifest, placed.tree, cache=cache, verify=verify,
                    progress=progress, named=dest)


def fetch_once(store: Store, manifest: Callable[[], Manifest], dest: Path, *,
               cache: BlobCache) -> Path:
    """*dest*, a directory named by its content that the processes of this machine share (a
    build's fetched inputs, a smoke's model), holding the files of *manifest()* (read only
    when it must be fetched). The first process that needs it fetches it while holding the
    flock of `.DEST.lock` beside it; the others wait, then find it whole (a fetch places all
    or nothing) and use it as it is. Without the lock, a second builder found the first one's
    copy placed mid-way and stopped with "not empty", or replaced it while the first one's
    tool was reading it."""
    if not dest.is_dir():
        with flock(dest.parent / f".{dest.name}.lock"):
            if not dest.is_dir():
                fetch_manifest(store, manifest(), dest, cache=cache)
    return dest
