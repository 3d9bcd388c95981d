"""fetch: an artifact by digest into a directory a server can load, verified, all or nothing.

The manifest comes from the local cache's copy when it has one (a manifest is named by
its own sha256, re-checked on every read), else from the store, keeping a copy. Blobs come
through the local cache (parallel downloads, verified with xxh3-128 while streaming), then
are placed into a temporary directory beside the target, which is renamed into place only
when every file checked out; `strict` re-hashes every placed file with
xxh3-128 and sha256, cache hits included. A failure leaves the target as it was.

The store is opened only when something has to be read from it (`LazyStore`): a refetch by
full digest whose manifest and blobs are in the cache makes no store request and, for S3,
never imports boto3. An alias or a prefix is still resolved by the registry each time.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from registry.cache import BlobCache
from registry.damage import set_aside_damaged_blob, set_aside_damaged_manifest
from registry.digest import Digest, digest_file
from registry.errors import (
    IntegrityError,
    ManifestError,
    NotFoundError,
    RecordNotFoundError,
    StoppedError,
    StoreError,
    UsageError,
)
from registry.lookup import Found, lookup
from registry.manifest import FileEntry, Manifest
from registry.progress import NoProgress, Progress
from registry.store import WORKERS, Store
from registry.workers import Workers

if TYPE_CHECKING:
    from registry.context import Context

Verify = Literal["fast", "strict"]
PSEUDO_FILE_SYSTEMS: Final = (Path("/proc"), Path("/sys"), Path("/dev"))
"""Kernel views a fetch never writes into."""
INSIDE_REFUSED: Final = ("the store", "the fetch cache")
"""Places a target may not lie inside, as well as not be or be above (pull's and fetch's
command line add older fetch caches and enginectl's home: `pipeline.deploy.guard`)."""


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


def protected_places(store: Store, cache: BlobCache,
                     extra: Iterable[tuple[str, Path]] = ()) -> list[tuple[str, Path]]:
    """What a fetch (or pull) target may never be, nor be a folder above: `/`, the working
    directory, the user's home, the store (`file://`) and the cache, plus *extra*
    (enginectl's home)."""
    places = [("the root directory", Path("/")), ("the fetch cache", cache.root),
              *(("an older fetch cache", root) for root in cache.legacy), *extra]
    for what, where in (("the working directory", Path.cwd), ("your home directory",
                                                             Path.home)):
        with contextlib.suppress(OSError, RuntimeError):  # a removed cwd, no HOME
            places.append((what, where()))
    root = getattr(store, "root", None)
    if isinstance(root, Path):
        places.append(("the store", root))
    return places


def check_target_place(dest: Path, places: Iterable[tuple[str, Path]], verb: str = "fetch",
                       inside: Iterable[str] = INSIDE_REFUSED) -> Path:
    """*dest* made absolute with `..` folded away; UsageError when it is, or is above, one of
    *places*, lies inside one of those named in *inside*, or lies in /proc, /sys or /dev.
    *verb* names the command in the message (fetch, pull)."""
    inside = frozenset(inside)
    absolute = _lexical(dest)
    seen = {absolute, _resolved(absolute)}
    for what, place in places:
        for known in {_lexical(place), _resolved(place)}:
            for candidate in seen:
                if candidate == known or candidate in known.parents:
                    raise UsageError(
                        f"refusing to {verb} into {dest}: it is {what} ({known}) or a folder "
                        f"above it; {verb} into a directory of its own, e.g. -o ./model")
                if what in inside and known in candidate.parents:
                    raise UsageError(f"refusing to {verb} into {dest}: it is inside {what} "
                                     f"({known}); {verb} into a directory of its own")
    for candidate in seen:
        for pseudo in PSEUDO_FILE_SYSTEMS:
            if candidate == pseudo or pseudo in candidate.parents:
                raise UsageError(f"refusing to {verb} into {dest}: {pseudo} is a view of the "
                                 f"kernel, not storage; {verb} into a directory on a disk")
    return absolute


def _lexical(path: Path) -> Path:
    """*path* absolute, with `.` and `..` parts folded away as written (no links followed)."""
    return Path(os.path.normpath(path.absolute()))


def _resolved(path: Path) -> Path:
    """*path* with its links followed; as written when they loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return _lexical(path)


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


def _staging(dest: Path) -> Path:
    """A private temp directory beside *dest*, named so `_clear_abandoned` can find it."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.fetch-{_owner()}-", dir=dest.parent))
    except OSError as exc:
        raise UsageError(f"cannot write beside {dest}: {exc.strerror or exc}; fetch into a "
                         "directory you can write") from exc


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
        except IntegrityError as exc:
            aside = set_aside_damaged_blob(self.store, digest, exc)
            if aside:
                hint = (f"the damaged blob was moved to {aside} in {self.store.url}; publish "
                        "the same content again (`enginectl import`, or rebuild) to restore it")
            elif exc.actual is None:
                hint = ("read again whole, it was not proven damaged and stays in the store: "
                        "the server or something on the way answers wrongly; retry the fetch")
            else:
                hint = ("read again, it gave other bytes: the network or the server is "
                        "corrupting transfers; retry the fetch")
            raise IntegrityError(f"{entry.path} ({exc.location})", expected=exc.expected,
                                 actual=exc.actual, detail=exc.detail, hint=hint) from exc
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


def fetch_manifest(
    store: Store,
    manifest: Manifest,
    dest: Path | str,
    *,
    cache: BlobCache,
    verify: Verify = "fast",
    force: bool = False,
    progress: Progress | None = None,
    protect: Iterable[tuple[str, Path]] = (),
    named: Path | None = None,
) -> Fetched:
    """Materialise *manifest* at *dest*. *dest* must be absent or empty unless *force*, and
    never one of `protected_places` (or above one). Ctrl-C (KeyboardInterrupt) stops every
    transfer at its next chunk and raises StoppedError saying what the cache kept and that
    *named* (the directory the user asked for, when *dest* is staged for it; else *dest*)
    was left as it was."""
    dest = check_target_place(Path(dest), protected_places(store, cache, protect))
    _clear_abandoned(dest)  # first: it may put back what a killed fetch had set aside
    _check_target(dest, force)
    run = _Run(store, manifest, cache, progress or NoProgress())
    pool = Workers(WORKERS, name="fetch")
    staging: Path | None = None
    try:
        found = list(pool.map(lambda d: cache.verified(d, run.by_digest[d].size) is not None,
                              run.by_digest))
        cached = {d for d, ok in zip(run.by_digest, found, strict=True) if ok}
        missing = [d for d in run.by_digest if d not in cached]
        run.progress.start("fetching", manifest.size)
        staging = _staging(dest)
        list(pool.map(run.download, missing))
        list(pool.map(lambda e: run.place(e, staging, cached=e.xxh3 in cached, verify=verify),
                      manifest.files))
        staging.chmod(0o755)  # mkdtemp made it private; the result is an ordinary directory
        _swap_into_place(staging, dest)
    except KeyboardInterrupt as exc:
        run.stop.set()  # in-flight reads end at their next chunk; daemon threads never wait
        pool.shutdown(wait=False, cancel_futures=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        run.progress.finish()
        raise StoppedError(f"interrupted: {named or dest} was left as it was; {run.kept()}; "
                           "run the same fetch again to resume from them") from exc
    except BaseException:
        run.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # nothing writes into staging after
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        run.progress.finish()
    pool.shutdown()
    return Fetched(manifest, dest, run.downloaded, manifest.size - run.downloaded)


def _owner() -> str:
    """Who made a staging or set-aside directory: `HOST-PID`, read back by _clear_abandoned."""
    return f"{os.uname().nodename}-{os.getpid()}"  # gethostname(2), without importing socket


def _clear_abandoned(dest: Path) -> None:
    """Tidy what fetches into *dest* that were killed on this host left beside it: staging
    directories (`.DEST.fetch-HOST-PID-X`) are removed; a set-aside previous content
    (`.DEST.old-HOST-PID`, killed mid-swap) is put back when DEST is missing, else removed.
    Directories of live processes and of other hosts are left alone."""
    host = os.uname().nodename
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
    except BaseException:  # an OSError, or Ctrl-C between the two renames
        old.rename(dest)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)


class LazyStore:
    """The context's store, opened on first use: a fetch whose manifest and blobs are all in
    the cache never opens it (for S3, never imports boto3: a quarter of a second here)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    @property
    def root(self) -> Path | None:
        """A file:// store's folder (what a fetch target may never be), without opening it."""
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(self._ctx.config.store_url)
        return Path(unquote(parts.path)) if parts.scheme == "file" else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx.store, name)


def lazy_store(ctx: Context) -> Store:
    """`LazyStore` typed as the `Store` it stands for (every method, through __getattr__)."""
    return cast("Store", LazyStore(ctx))


def cached_manifest(store: Store, cache: BlobCache, digest: str, *,
                    heal: bool = False) -> Manifest:
    """The manifest of *digest*: the cache's copy when its bytes still hash to *digest*, else
    `manifest_of` the store (with *heal*), keeping a copy for the next fetch."""
    parsed = Digest.parse(digest)
    data = cache.manifest(parsed)
    if data is not None:
        with contextlib.suppress(ManifestError):  # verified bytes of an unsafe manifest: ask
            manifest = Manifest.from_bytes(data)  # the store, which will say so itself
            if str(manifest.digest) == digest:
                return manifest
    manifest = manifest_of(store, digest, heal=heal)
    cache.keep_manifest(parsed, manifest.to_bytes())
    return manifest


def load_manifest(ctx: Context, digest: str) -> Manifest:
    """The manifest of *digest* from the store, verified and checked for safety."""
    return manifest_of(ctx.store, digest)


def manifest_of(store: Store, digest: str, *, heal: bool = False) -> Manifest:
    """The manifest of *digest* from *store*, verified and checked for safety; with *heal*,
    one that fails its sha256 twice is set aside (`registry.damage`) before the error."""
    try:
        data = store.get_manifest(Digest.parse(digest))
    except IntegrityError as exc:
        if not heal:
            raise
        aside = set_aside_damaged_manifest(store, Digest.parse(digest), exc)
        hint = (f"it was moved to {aside} in {store.url}; publish the same content again "
                "(`enginectl import`, or rebuild) to restore it" if aside else None)
        raise IntegrityError(exc.location, expected=exc.expected, actual=exc.actual,
                             hint=hint) from exc
    manifest = Manifest.from_bytes(data)
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
    node needs only the bucket; with its manifest and blobs in the cache, not even that.
    One the store has no manifest of either is not found (exit 6, `artifact_manifest`).
    The registry is read without SQLAlchemy (`registry.lookup`) so that a fetch starts
    quickly. The target is checked before anything is read. A
    `quarantined` artifact is refused unless *allow_unready*; see `status_notes` for what
    else is said."""
    protect = [("enginectl's home", ctx.config.home)]
    store = lazy_store(ctx)
    dest = check_target_place(Path(dest), protected_places(store, ctx.cache, protect))
    chosen = choose(ctx, ref, allow_unready=allow_unready)
    fetched = fetch_manifest(store, chosen.manifest, dest, cache=ctx.cache, verify=verify,
                             force=force, progress=progress, protect=protect)
    return replace(fetched, notes=chosen.notes)


@dataclass(frozen=True)
class Chosen:
    """What a fetch of a REF places, decided before a blob is read."""

    found: Found
    manifest: Manifest
    notes: tuple[str, ...]


def choose(ctx: Context, ref: str, *, allow_unready: bool = False) -> Chosen:
    """The artifact *ref* names (`find`), its manifest (`artifact_manifest`, healing a
    damaged one) and what fetch says about its status (`status_notes`, or refused)."""
    found = find(ctx, ref)
    ctx.begin(store=False)  # opened when the cache lacks the manifest or a blob
    manifest = artifact_manifest(lazy_store(ctx), ctx.cache, found, heal=True)
    return Chosen(found, manifest,
                  status_notes(found, manifest.kind, allow_unready=allow_unready))


def artifact_manifest(store: Store, cache: BlobCache, found: Found, *,
                      heal: bool = False) -> Manifest:
    """`cached_manifest` of what `find` found. A digest the registry does not list (status
    None) that the store has no manifest of either is not found (RecordNotFoundError, exit
    6). A store that cannot be read (a `file://` folder that is not there, a missing bucket,
    no answer) and a manifest that is there but damaged stay store errors (exit 4), and so
    does a manifest missing for a digest the registry lists: the store lost it."""
    try:
        return cached_manifest(store, cache, found.digest, heal=heal)
    except NotFoundError as exc:
        if found.status is not None:
            raise
        root = getattr(store, "root", None)
        if isinstance(root, Path) and not root.is_dir():
            raise StoreError(f"store {store.url} cannot be read: its folder {root} does not "
                             "exist (a volume not mounted, the wrong ENGINECTL_STORE_URL, or "
                             "nothing published yet)",
                             url=store.url, operation="get_manifest", key=exc.key) from exc
        raise RecordNotFoundError(
            "artifact", found.digest,
            hint=f"the store {store.url} has no manifest of it either; `enginectl ls` lists "
                 "the artifacts there are") from exc


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
