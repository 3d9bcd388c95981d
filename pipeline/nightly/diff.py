"""What changed between two probes of a pool, and which keys of a plan that change moves
(and through which field). Pure.

Two plans of one recipe pair up by target and position in the target's chain (snapshot
first, smoke last): where the keys differ, the stage run is invalidated, and the reason is
the fingerprint fields its key takes that differ (`driver 570.124.06 → 575.57.08`), else
an input whose key changed, else its parameters (the recipe changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.planning.plan import Plan
from pipeline.planning.toolchain import FIELDS


@dataclass(frozen=True, slots=True)
class FieldChange:
    field: str
    old: Any
    new: Any

    def __str__(self) -> str:
        old = "-" if self.old is None else self.old
        new = "-" if self.new is None else self.new
        return f"{self.field} {old} → {new}"

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new}


def toolchain_changes(old: Mapping[str, Any] | None,
                      new: Mapping[str, Any]) -> list[FieldChange]:
    """The fields of fingerprint *new* that differ from *old* (none when *old* is None:
    a first probe is not a change)."""
    if old is None:
        return []
    return [FieldChange(name, old.get(name), new.get(name)) for name in FIELDS
            if old.get(name) != new.get(name)]


@dataclass(frozen=True, slots=True)
class KeyChange:
    """One stage run of one target whose key differs between two plans."""

    target: str
    stage: str
    old_key: str
    new_key: str
    because: tuple[str, ...]  # "driver 570.124.06 → 575.57.08", "input", "params"

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "stage": self.stage, "old_key": self.old_key,
                "new_key": self.new_key, "because": list(self.because)}


def key_changes(old: Plan, new: Plan) -> list[KeyChange]:
    """Every stage run of *new* whose key is not the one *old* gave the same target there."""
    before = {p.target.id: p.chain for p in old.targets}
    found: list[KeyChange] = []
    for planned in new.targets:
        chain = before.get(planned.target.id)
        if chain is None or len(chain) != len(planned.chain):
            continue  # a target the old plan did not have: new, not invalidated
        for old_key, new_key in zip(chain, planned.chain, strict=True):
            if old_key == new_key:
                continue
            was, now = old.stages[old_key], new.stages[new_key]
            because = [str(FieldChange(name, was.toolchain.get(name), now.toolchain.get(name)))
                       for name in now.toolchain if was.toolchain.get(name)
                       != now.toolchain.get(name)]
            if not because:
                because = ["input"] if was.inputs != now.inputs else ["params"]
            found.append(KeyChange(planned.target.id, now.stage, old_key, new_key,
                                   tuple(because)))
    return found
