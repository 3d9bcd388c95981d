"""Whether a rollback pins an alias: one decision over plain values, so that the ORM's road
(`registry.sql.alias_records.pinned_by_rollback`) and the driver's (`registry.sql.showing`)
judge it the same way without either importing the other's database library."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class AliasEvent:
    name: str
    digest: str | None
    """None when the alias was removed."""
    previous_digest: str | None
    at: datetime
    note: str | None
    details: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Pin:
    """An alias held where a rollback put it: *to_digest*, away from *from_digest*."""

    alias: str
    from_digest: str
    to_digest: str
    at: datetime
    note: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"alias": self.alias, "from": self.from_digest, "to": self.to_digest,
                "at": self.at.isoformat(), "note": self.note}

    def describe(self) -> str:
        """`pinned by a rollback at 2026-12-02T… from sha256:…: TTFT regression`"""
        return (f"pinned by a rollback at {self.at.isoformat(timespec='seconds')} from "
                f"{self.from_digest[:19]}…" + (f": {self.note}" if self.note else ""))


def rollback_pin(alias: str, last: AliasEvent | None, points_at: str | None) -> Pin | None:
    """The rollback that pins *alias*, given its *last* move and where it *points_at* now:
    that move, when it was a `rollback` and the alias still points where it put it; None
    otherwise."""
    if last is None or last.digest is None or not (last.details or {}).get("rollback"):
        return None
    left = (last.details or {}).get("from") or last.previous_digest
    if not isinstance(left, str) or points_at != last.digest:
        return None
    return Pin(alias, left, last.digest, last.at, last.note)
