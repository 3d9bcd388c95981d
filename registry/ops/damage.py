"""Damaged objects are taken out of the way, so that the next publish of their content heals
the store; a good object is never taken for one.

A blob whose bytes do not hash to its digest (a flipped byte, a truncation) or a manifest
whose bytes are not its sha256 stays damaged forever if it is left in place: publish trusts
a blob of the right size and would never upload it again. What a fetch or `fsck --repair`
finds damaged is therefore moved under `damaged/<at>-<token>/<its key>` (layout in
`registry.identity.layout`; gc removes it once older than its grace period), once the damage
is shown from the store's side: the object is read back whole by a path other than the
failing one (`Store.read_back`), and the store vouches that the bytes that fail are the ones
it holds (the checksum S3 computed when they were written; the file itself, for a file
store). One client's reads alone prove nothing: a network path that flips a byte in every
answer gives the same wrong bytes each time, and had four good objects set aside, after
which every node's fetch said "not found". What a read says without hashing (a size in a
Content-Range or a HEAD, a short file) only sends the object to be read back. `judge` is
the one function that decides; everything here acts on its verdict. Nothing here imports
SQLAlchemy: fetch uses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from registry.errors import IntegrityError, NotFoundError, StoreError
from registry.identity.digest import Digest
from registry.identity.layout import (
    DAMAGED,
    DamagedName,
    damaged_name,
    manifest_name,
    parse_damaged_name,
)
from registry.store.base import ObjectInfo, ReadBack, Store

Verdict = Literal["damaged", "intact", "transfer", "unproven"]


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a read back of a suspect object showed: *verdict*, and *why* in a few words."""

    verdict: Verdict
    why: str


def judge(expected: Digest, reading: ReadBack | None, failure: str = "") -> Judgement:
    """The verdict on a stored object that failed a read: "damaged" only when the bytes
    read back fail *expected* and the store vouches for them; "intact" when they hash
    right (the failing read was corrupted on the way); "transfer" when the store's own
    checksum says they changed on the way; "unproven" when the store keeps no checksum to
    compare with, or the read back failed (*reading* None, *failure* says how). Pure."""
    if reading is None:
        return Judgement("unproven", f"reading it back failed: {failure}")
    if reading.digest == expected:
        return Judgement("intact", "read back whole, its bytes hash right")
    if reading.vouch == "stored":
        return Judgement("damaged", f"read back, it hashes to {reading.digest} and "
                                    f"{reading.evidence}")
    if reading.vouch == "altered":
        return Judgement("transfer", f"read back, {reading.evidence}")
    return Judgement("unproven", f"read back, it hashes to {reading.digest} but "
                                 f"{reading.evidence}")


def judge_object(store: Store, key: str, expected: Digest) -> Judgement:
    """`judge` the object at *key* after reading it back from *store*."""
    try:
        reading = store.read_back(key, expected.algorithm)
    except (NotFoundError, StoreError) as exc:
        return judge(expected, None, str(exc))
    return judge(expected, reading)


def set_aside(store: Store, key: str, *, now: datetime | None = None) -> str | None:
    """Move the blob or manifest at *key* under `damaged/`; its new key, None if absent."""
    aside = damaged_name(key, now or datetime.now(UTC), uuid.uuid4().hex)
    return aside if store.move_object(key, aside) else None


def set_aside_damaged(store: Store, key: str, expected: Digest) -> tuple[Judgement, str | None]:
    """The verdict on the object at *key*, and where it was set aside when damaged."""
    judgement = judge_object(store, key, expected)
    return judgement, set_aside(store, key) if judgement.verdict == "damaged" else None


def set_aside_damaged_manifest(store: Store, digest: Digest) -> str | None:
    """Set the manifest aside when `judge` finds it damaged; its new key, or None."""
    return set_aside_damaged(store, manifest_name(digest), digest)[1]


def read_failure(store: Store, key: str, what: str, exc: IntegrityError) -> IntegrityError:
    """The error to raise for *exc*, a read of the object at *key* (*what*: the file it
    fills, or the manifest) that failed its digest, once the object is judged and, when
    damaged, set aside: its hint says which it was and what to do."""
    judgement, aside = set_aside_damaged(store, key, Digest.parse(str(exc.expected)))
    thing = "blob" if key.startswith("blobs/") else "manifest"
    if aside:
        hint = (f"{judgement.why}: the damaged {thing} was moved to {aside} in {store.url}; "
                "publish the same content again (`enginectl import`, or rebuild) to restore "
                "it")
    elif judgement.verdict in ("intact", "transfer"):
        hint = (f"a transfer error: {judgement.why}; the bytes were corrupted on the way "
                f"from {store.url}, not in it, so the {thing} stays in the store; retry, or "
                "fetch over another network path")
    else:
        hint = (f"not proven damaged ({judgement.why}), so the {thing} stays in the store; "
                "retry, and if every node sees the same, delete the object "
                f"{key} in {store.url} and publish its content again")
    return IntegrityError(f"{what} ({exc.location})" if what else exc.location,
                          expected=exc.expected, actual=exc.actual, detail=exc.detail,
                          hint=hint)


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
