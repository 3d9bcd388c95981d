"""What a stage run came to, and the summary of a whole build: the executors' common output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["built", "reused", "failed", "skipped", "waiting", "pending-smoke",
                 "smoke-failed", "cancelled"]


def awaits_smoke(reason: str) -> str:
    """The status reason of an entry this machine cannot smoke (shown by ls and show)."""
    return f"awaits smoke: {reason}"


def pending_smoke(stage: str, key: str, targets: list[str], *, entry: str, gpu: str | None,
                  reason: str) -> Outcome:
    """The outcome of a smoke run this machine cannot run: the entry stays built."""
    return Outcome(stage, key, "pending-smoke", targets, digest=entry,
                   error=f"stays built: {reason}; run `enginectl smoke {entry}` on a {gpu} node")


@dataclass
class Outcome:
    stage: str
    key: str
    status: Status
    targets: list[str]
    seconds: float = 0.0
    digest: str | None = None
    error: str | None = None
    saved_seconds: float = 0.0  # for a reuse: how long the original run took
    node: dict[str, str] | None = None  # where it ran: {"host", "node_id"} (Ray: its node)

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "key": self.key, "status": self.status,
                "targets": self.targets, "seconds": round(self.seconds, 3),
                "digest": self.digest, "error": self.error,
                "saved_seconds": round(self.saved_seconds, 3), "node": self.node}


@dataclass
class BuildSummary:
    outcomes: list[Outcome] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C stopped the build: what finished is kept

    @property
    def kept(self) -> list[Outcome]:
        """Runs that finished, their artifact in the store and registry (built, reused, or
        awaiting or past its smoke run)."""
        return [o for o in self.outcomes
                if o.status in ("built", "reused", "pending-smoke", "smoke-failed")]

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "built": self.count("built"), "reused": self.count("reused"),
            "failed": self.count("failed"), "skipped": self.count("skipped"),
            "pending_smoke": self.count("pending-smoke"),
            "smoke_failed": self.count("smoke-failed"),
            "cancelled": self.count("cancelled"),
            "interrupted": self.interrupted,
            "saved_seconds": round(sum(o.saved_seconds for o in self.outcomes), 3),
            "stages": [o.as_dict() for o in self.outcomes],
        }
