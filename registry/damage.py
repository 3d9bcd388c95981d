"""Damaged objects are taken out of the way, so that the next publish of their content heals
the store.

A blob whose bytes do not hash to its digest (a flipped byte, a truncation) or a manifest
whose bytes are not its sha256 stays damaged forever if it is left in place: publish trusts
a blob of the right size and would never upload it again. What a fetch or `fsck --repair`
finds damaged is therefore moved under `damaged/<at>-<token>/<its key>` (layout in
`registry.layout`; gc removes it once older than its grace period), after the damage is
proven: a hash mismatch is read a second time and must give the same wrong digest (a
network that corrupted one transfer must not cost a good blob); a wrong size is damage as it
stands. Nothing here imports SQLAlchemy: fetch uses it.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from registry.digest import Digest
from registry.errors import IntegrityError, NotFoundError
from registry.layout import (
    DAMAGED,
    DamagedKey,
    blob_key,
    damaged_key,
    manifest_key,
    parse_damaged_key,
)
from registry.store import ObjectInfo, Store


def set_aside(store: Store, key: str, *, now: datetime | None = None) -> str | None:
    """Move the blob or manifest at *key* under `damaged/`; its new key, None if absent."""
    aside = damaged_key(key, now or datetime.now(UTC), uuid.uuid4().hex)
    return aside if store.move_object(key, aside) else None


def blob_is_damaged(store: Store, digest: Digest, size: int | None,
                    first: IntegrityError) -> bool:
    """Whether the blob really is damaged, given the IntegrityError of one read: a wrong
    size is; a wrong digest is when a second read gives the same wrong digest."""
    if first.actual is None:
        return True
    with tempfile.TemporaryDirectory(prefix="enginectl-recheck-") as scratch:
        try:
            store.get_blob(digest, Path(scratch) / "blob", size=size)
        except IntegrityError as again:
            return again.actual == first.actual
        except NotFoundError:
            return False
    return False


def set_aside_damaged_blob(store: Store, digest: Digest, size: int | None,
                           first: IntegrityError) -> str | None:
    """Set the blob aside when `blob_is_damaged` proves it; the key it went to, or None."""
    if not blob_is_damaged(store, digest, size, first):
        return None
    return set_aside(store, blob_key(digest))


def set_aside_damaged_manifest(store: Store, digest: Digest) -> str | None:
    """Set the manifest aside when a second read fails its sha256 again; its new key."""
    try:
        store.get_manifest(digest)
    except IntegrityError:
        return set_aside(store, manifest_key(digest))
    except NotFoundError:
        return None
    return None


@dataclass(frozen=True, slots=True)
class Damaged:
    key: DamagedKey
    info: ObjectInfo


def iter_damaged(store: Store) -> Iterator[Damaged]:
    """Every object set aside under `damaged/` (anything else there is skipped)."""
    for info in store.list_objects(DAMAGED):
        try:
            yield Damaged(parse_damaged_key(info.key), info)
        except ValueError:
            continue
