"""fetch: an artifact by digest into a directory a server can load, verified, all or nothing.

Blobs come through the local cache (parallel downloads, verified with xxh3-128 while
streaming), then are placed into a temporary directory beside the target, which is renamed
into place only when every file checked out; `strict` re-hashes every placed file with
xxh3-128 and sha256, cache hits included. A failure leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from registry.cache import BlobCache
from registry.digest import Digest, digest_file
from registry.errors import IntegrityError, ManifestError, RecordNotFoundError, UsageError
from registry.lookup import Found, lookup
from registry.manifest import FileEntry, Manifest
from registry.progress import NoProgress, Progress
from registry.store import WORKERS, Store

if TYPE_CHECKING:
    from registry.context import Context

Verify = Literal["fast", "strict"]


@dataclass(frozen=True)
class Fetched:
    manifest: Manifest
    path: Path
    downloaded_bytes: int
    cached_bytes: int
    notes: tuple[str, ...] = ()
    """What the caller should tell the user (the CLI prints them on stderr): an artifact
    fetched before it was proven to serve, or one fetched despite its status."""


def _check_target(dest: Path, force: bool) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise UsageError(f"{dest} is not empty; fetch into an empty directory or pass --force")


def _rehash(path: Path, entry: FileEntry) -> None:
    """`--verify strict` of a cache entry: xxh3-128 and sha256 (the entry is a read-only file
    enginectl wrote, so it is hashed through mmap)."""
    found = digest_file(path, mapped=True)
    if found.xxh3 != entry.xxh3:
        raise IntegrityError(entry.path, expected=entry.xxh3, actual=found.xxh3)
    if found.sha256 is not None and found.sha256 != entry.sha256:  # always set: with_sha256
        raise IntegrityError(entry.path, expected=entry.sha256, actual=found.sha256)


def _inside(root: Path, relative: str) -> Path:
    """Where *relative* goes under *root*; never outside it (manifests are checked on parse,
    this is the second lock)."""
    target = root.joinpath(*relative.split("/"))
    if not target.resolve().is_relative_to(root.resolve()):
        raise ManifestError(f"file path {relative!r} leaves the target directory")
    return target


def _place(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def fetch_manifest(
    store: Store,
    manifest: Manifest,
    dest: Path | str,
    *,
    cache: BlobCache,
    verify: Verify = "fast",
    force: bool = False,
    progress: Progress | None = None,
) -> Fetched:
    """Materialise *manifest* at *dest*. *dest* must be absent or empty unless *force*."""
    dest = Path(dest).absolute()
    _clear_abandoned(dest)  # first: it may put back what a killed fetch had set aside
    _check_target(dest, force)
    progress = progress or NoProgress()
    by_digest = {entry.xxh3: entry for entry in manifest.files}
    cached = {d for d, e in by_digest.items() if cache.has(d, e.size)}
    missing = [d for d in by_digest if d not in cached]
    downloaded = sum(by_digest[d].size for d in missing)
    progress.start("fetching", manifest.size)

    def download(digest: Digest) -> None:
        entry = by_digest[digest]
        try:
            cache.fill(digest, lambda temp: store.get_blob(
                digest, temp, size=entry.size, progress=progress.advance))
        except IntegrityError as exc:
            raise IntegrityError(
                f"{entry.path} ({exc.location})", expected=exc.expected, actual=exc.actual
            ) from exc

    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.fetch-{_owner()}-", dir=dest.parent))
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(download, missing))

            def place(entry: FileEntry) -> None:
                source = cache.path(entry.xxh3)
                # The cache holds only bytes verified on their way in (read-only entries
                # renamed into place), so `fast` trusts them; `strict` re-hashes everything.
                if verify == "strict":
                    try:
                        _rehash(source, entry)
                    except IntegrityError:
                        cache.evict(entry.xxh3)
                        raise
                if entry.xxh3 in cached:
                    progress.advance(entry.size)
                _place(source, _inside(staging, entry.path))

            list(pool.map(place, manifest.files))
        staging.chmod(0o755)  # mkdtemp made it private; the result is an ordinary directory
        _swap_into_place(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        progress.finish()
    return Fetched(manifest, dest, downloaded, manifest.size - downloaded)


def _owner() -> str:
    """Who made a staging or set-aside directory: `HOST-PID`, read back by _clear_abandoned."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _clear_abandoned(dest: Path) -> None:
    """Tidy what fetches into *dest* that were killed on this host left beside it: staging
    directories (`.DEST.fetch-HOST-PID-X`) are removed; a set-aside previous content
    (`.DEST.old-HOST-PID`, killed mid-swap) is put back when DEST is missing, else removed.
    Directories of live processes and of other hosts are left alone."""
    host = socket.gethostname()
    for path in dest.parent.glob(f".{glob.escape(dest.name)}.*-*"):
        kind, _, owner = path.name[len(dest.name) + 2:].partition("-")
        if kind == "fetch":
            owner = owner.rsplit("-", 1)[0]
        elif kind != "old":
            continue
        their_host, _, pid = owner.rpartition("-")
        if their_host != host or not pid.isdigit() or _alive(int(pid)) or not path.is_dir():
            continue
        if kind == "old" and not dest.exists():
            path.rename(dest)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _swap_into_place(staging: Path, dest: Path) -> None:
    if not dest.exists():
        staging.rename(dest)
        return
    if not any(dest.iterdir()):
        dest.rmdir()
        staging.rename(dest)
        return
    old = dest.parent / f".{dest.name}.old-{_owner()}"
    dest.rename(old)
    try:
        staging.rename(dest)
    except OSError:
        old.rename(dest)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)


def load_manifest(ctx: Context, digest: str) -> Manifest:
    """The manifest of *digest* from the store, verified and checked for safety."""
    manifest = Manifest.from_bytes(ctx.store.get_manifest(Digest.parse(digest)))
    if str(manifest.digest) != digest:
        raise IntegrityError(f"manifest {digest}", expected=Digest.parse(digest),
                             actual=manifest.digest)
    return manifest


def status_notes(found: Found, kind: str, *, allow_unready: bool) -> tuple[str, ...]:
    """What fetch says about *found*'s status, or raises: a `quarantined` artifact failed its
    smoke run and is refused without *allow_unready* (exit 4, with the reason); a servable
    artifact that is `built` (or `building`) is not yet proven and is fetched with a note.
    Intermediates (checkpoints) are never smoke-tested, and `superseded` ones are what a
    rollback fetches: both come without a word. Pure."""
    from registry.errors import UnreadyError
    from registry.resolve import KIND_ORDER

    ref = found.digest[:19]
    if found.status == "quarantined":
        if not allow_unready:
            raise UnreadyError(found.digest, "quarantined", found.reason, verb="fetch")
        reason = found.reason or "no reason recorded"
        return (f"{found.digest} is quarantined ({reason}); fetched because of --allow-unready",)
    if found.status in ("built", "building") and kind in KIND_ORDER:
        note = (f"{found.digest} is {found.status}, not yet proven to serve (no passing smoke "
                f"run); `enginectl smoke {ref}` on a node that can serve it proves it")
        return (note,)
    return ()


def fetch(
    ctx: Context,
    ref: str,
    dest: Path | str,
    *,
    verify: Verify = "fast",
    force: bool = False,
    allow_unready: bool = False,
    progress: Progress | None = None,
) -> Fetched:
    """Fetch the artifact *ref* names (digest, unique prefix or alias) into *dest*.

    A full digest the registry does not know is still fetched from the store, so a deploy
    node needs only the bucket. The registry is read without SQLAlchemy (`registry.lookup`)
    so that a fetch starts quickly. A `quarantined` artifact is refused unless
    *allow_unready*; see `status_notes` for what else is said."""
    found = find(ctx, ref)
    manifest = load_manifest(ctx, found.digest)
    notes = status_notes(found, manifest.kind, allow_unready=allow_unready)
    fetched = fetch_manifest(ctx.store, manifest, Path(dest), cache=ctx.cache, verify=verify,
                             force=force, progress=progress)
    return replace(fetched, notes=notes)


def find(ctx: Context, ref: str) -> Found:
    """What *ref* names, and its status, read without SQLAlchemy; a full digest the registry
    does not know is taken as is (status None). A deleted artifact is refused."""
    try:
        found = lookup(ctx.config.registry_url, ref)
    except RecordNotFoundError:
        if not ref.startswith("sha256:") or len(ref) != len("sha256:") + 64:
            raise
        found = Found(ref, None)
    if found.status == "deleted":
        raise UsageError(f"artifact {found.digest} is deleted; its files may be gone")
    return found
