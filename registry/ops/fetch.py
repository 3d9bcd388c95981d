"""fetch: an artifact by digest into a directory a server can load, verified, all or nothing.

The manifest comes from the local cache's copy when it has one (a manifest is named by
its own sha256, re-checked on every read), else from the store, keeping a copy. This module
decides what a ref fetches (`choose`: the artifact, its manifest, what is said about its
status) and `fetch` is the one fetch: the CLI's `enginectl fetch` and the Python API's.
The files are placed by `registry.ops.fetch_files.fill` into a placement
(`registry.ops.placement`), all or nothing, after the target rule (`registry.ops.target`).

The store is opened only when something has to be read from it (`LazyStore`): a refetch by
full digest whose manifest and blobs are in the cache makes no store request and, for S3,
never imports boto3. An alias or a prefix is still resolved by the registry each time.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from registry.errors import (
    DeletedError,
    IntegrityError,
    ManifestError,
    NotFoundError,
    RecordNotFoundError,
    StoreError,
)
from registry.identity.digest import Digest
from registry.identity.layout import manifest_name
from registry.identity.manifest import Manifest
from registry.ops.damage import read_failure
from registry.ops.fetch_files import Fetched, Verify, fill, protected_places
from registry.ops.marker import MARKER
from registry.ops.placement import check_dest, placing
from registry.ops.target import Target
from registry.progress import Progress
from registry.sql.lookup import Found, lookup
from registry.store.base import Store
from registry.store.cache import BlobCache

if TYPE_CHECKING:
    from registry.context import Context


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
    one that fails its sha256 twice is set aside (`registry.ops.damage`) before the error."""
    try:
        data = store.get_manifest(Digest.parse(digest))
    except IntegrityError as exc:
        if not heal:
            raise
        raise read_failure(store, manifest_name(Digest.parse(digest)), "", exc) from exc
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
    from registry.ops.resolve import KIND_ORDER

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
    """Fetch the artifact *ref* names (digest, unique prefix or alias) into *dest*: what
    `enginectl fetch` runs.

    *dest* is checked first by the one target rule (`check_target`: absent or empty; with
    *force*, one an earlier pull or fetch filled, proven file by file; never the store, the
    cache, a home or the working directory). A full digest the registry does not know is
    still fetched from the store, so a deploy node needs only the bucket; with its manifest
    and blobs in the cache, not even that. One the store has no manifest of either is not
    found (exit 6, `artifact_manifest`). The registry is read without SQLAlchemy
    (`registry.sql.lookup`) so that a fetch starts quickly. A `quarantined` artifact is
    refused unless *allow_unready*; see `status_notes` for what else is said. The files are
    placed by `registry.ops.placement` (a mount point filled in place), with the marker (by
    "fetch") that lets a later `--force` replace them; an artifact that has a top-level
    file of the marker's name keeps its own, and that directory is then not replaced."""
    target = check_target(ctx, dest, verb="fetch", force=force, verify=verify)
    chosen = choose(ctx, ref, allow_unready=allow_unready)
    manifest = chosen.manifest
    digest = str(manifest.digest)
    mark = MARKER not in {entry.path.split("/", 1)[0] for entry in manifest.files}
    with placing(target, by="fetch", digest=digest, mark=mark) as placed:
        fetched = fill(lazy_store(ctx), manifest, placed.tree, cache=ctx.cache,
                       verify=verify, progress=progress, named=target.path)
        placed.record(sources=[digest])
    return replace(fetched, path=target.path, notes=chosen.notes)


def check_target(ctx: Context, dest: Path | str, *, verb: str, force: bool,
                 verify: Verify = "fast", own: bool = False) -> Target:
    """The one target rule (`registry.ops.placement.check_dest`) for a command's `-o`:
    never the store, the cache (or an older one), enginectl's home, `/`, a home or the
    working directory; what is there proven against manifests from the cache or the store.
    *own*: a directory of enginectl's home (`serve`'s serving directory), where only the
    content is judged."""
    places = [] if own else protected_places(lazy_store(ctx), ctx.cache,
                                             [("enginectl's home", ctx.config.home)])
    return check_dest(dest, verb=verb, force=force, places=places,
                      manifests=lambda digest: cached_manifest(lazy_store(ctx), ctx.cache,
                                                               digest),
                      strict=verify == "strict")


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


def find(ctx: Context, ref: str, *, verb: str = "fetch") -> Found:
    """What *ref* names, and its status, read without SQLAlchemy; a full digest the registry
    does not know is taken as is (status None). A deleted artifact is refused (DeletedError,
    exit 4: a state of the registry, as a quarantined one is), whatever the flags."""
    try:
        found = lookup(ctx.config.registry_url, ref, retry_s=ctx.config.registry_retry_s)
    except RecordNotFoundError:
        if not ref.startswith("sha256:") or len(ref) != len("sha256:") + 64:
            raise
        found = Found(ref, None)
    if found.status == "deleted":
        raise DeletedError(found.digest, verb=verb)
    return found
