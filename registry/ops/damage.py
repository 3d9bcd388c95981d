"""Damaged objects are taken out of the way, so that the next publish of their content heals
the store.

A blob whose bytes do not hash to its digest (a flipped byte, a truncation) or a manifest
whose bytes are not its sha256 stays damaged forever if it is left in place: publish trusts
a blob of the right size and would never upload it again. What a fetch or `fsck --repair`
finds damaged is therefore moved under `damaged/<at>-<token>/<its key>` (layout in
`registry.identity.layout`; gc removes it once older than its grace period), after the damage is
proven, by bytes alone: two whole reads whose bytes hash to the same wrong digest (a network
that corrupted one transfer must not cost a good blob). What a read says about the bytes
without hashing them (a size in a Content-Range or a HEAD, a short file) is a suspicion
that sends the blob to be read whole again, with no size assumed; a read that fails for any
other reason (a transport or protocol fault, the object gone meanwhile) proves nothing, and
the blob stays. Nothing here imports SQLAlchemy: fetch uses it.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from registry.errors import IntegrityError, NotFoundError, StoreError
from registry.identity.digest import Digest
from registry.identity.layout import (
    DAMAGED,
    DamagedName,
    blob_name,
    damaged_name,
    manifest_name,
    parse_damaged_name,
)
from registry.store.base import ObjectInfo, Store


def set_aside(store: Store, key: str, *, now: datetime | None = None) -> str | None:
    """Move the blob or manifest at *key* under `damaged/`; its new key, None if absent."""
    aside = damaged_name(key, now or datetime.now(UTC), uuid.uuid4().hex)
    return aside if store.move_object(key, aside) else None


def read_whole(store: Store, digest: Digest) -> Digest | None:
    """The digest the blob's bytes hash to on one fresh read of the whole object, no size
    assumed (*digest* when they check out); None when the read hashed nothing: the blob
    is gone, or the transport or the protocol failed."""
    with tempfile.TemporaryDirectory(prefix="enginectl-recheck-") as scratch:
        try:
            store.get_blob(digest, Path(scratch) / "blob")
        except IntegrityError as again:
            return again.actual
        except (NotFoundError, StoreError):
            return None
    return digest


def blob_is_damaged(store: Store, digest: Digest, first: IntegrityError | None = None) -> bool:
    """Whether the blob really is damaged: when two whole fresh reads hash its bytes to the
    same wrong digest. *first*, the IntegrityError of an earlier read, counts as one when it
    hashed them; a wrong size it saw, or one a listing or a HEAD reported (no *first*), only
    sends the blob to be read whole twice. A read that hashes nothing (a transport or
    protocol fault, the blob gone) proves nothing: False."""
    seen = first.actual if first is not None else None
    for _read in range(2):
        got = read_whole(store, digest)
        if got is None or got == digest:
            return False
        if seen is not None:
            return got == seen
        seen = got
    return False  # not reached: the second read always decides


def set_aside_damaged_blob(store: Store, digest: Digest,
                           first: IntegrityError | None) -> str | None:
    """Set the blob aside when `blob_is_damaged` proves it; the key it went to, or None."""
    if not blob_is_damaged(store, digest, first):
        return None
    return set_aside(store, blob_name(digest))


def set_aside_damaged_manifest(store: Store, digest: Digest,
                               first: IntegrityError | None = None) -> str | None:
    """Set the manifest aside when a second whole read fails its sha256 again (to the same
    wrong digest as *first*, when given); its new key, or None."""
    try:
        store.get_manifest(digest)
    except IntegrityError as again:
        if first is not None and first.actual is not None and again.actual != first.actual:
            return None
        return set_aside(store, manifest_name(digest))
    except (NotFoundError, StoreError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class Damaged:
    key: DamagedName
    info: ObjectInfo


def iter_damaged(store: Store) -> Iterator[Damaged]:
    """Every object set aside under `damaged/` (anything else there is skipped)."""
    for info in store.list_objects(DAMAGED):
        try:
            yield Damaged(parse_damaged_name(info.key), info)
        except ValueError:
            continue
