"""What `show` reads from the registry besides `listing`'s rows, on the database driver
alone (`registry.sql.lookup`'s reader), so that `show` never imports SQLAlchemy. Each read
answers what its ORM counterpart in `registry.sql` answers (`smoke_records.smoke_reports`,
`alias_records.alias_history` and `pinned_by_rollback`, `leases.get_stage_run`,
`refit_evidence.equivalence_for`), in `show`'s words; the two verdicts are one function
each, shared with the ORM's road (`alias_pins.rollback_pin`, `refit_verdict`). A test holds
`show` to what the ORM's reads said, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from registry.sql.alias_pins import AliasEvent, rollback_pin
from registry.sql.listing import listed_rows, utc_text, utc_time
from registry.sql.lookup import DriverReader
from registry.sql.refit_verdict import KIND, held_back, newest_equivalence


def _json(value: Any) -> Any:
    """A JSON column's value as the ORM's JSON type gives it (None for NULL or `null`)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def smoke_reports(reader: DriverReader, digest: str) -> list[dict[str, Any]]:
    """*digest*'s smoke reports, oldest first, each with where it ran."""
    return [{"passed": bool(passed), "created_at": utc_text(created_at), "gpu": gpu,
             "toolchain": _json(toolchain), "key": key, "report": _json(report)}
            for passed, created_at, gpu, toolchain, key, report in reader.rows(
                "SELECT s.passed, s.created_at, s.gpu, s.toolchain, s.key, s.report FROM "
                "smoke_reports s JOIN artifacts a ON a.id = s.artifact_id WHERE a.digest = ? "
                "ORDER BY s.created_at, s.id", digest)]


def alias_moves(reader: DriverReader, name: str) -> list[AliasEvent]:
    """Every move of the alias *name*, oldest first."""
    return [AliasEvent(str(name), digest, previous, utc_time(at), note, _json(details))
            for name, digest, previous, at, note, details in reader.rows(
                "SELECT name, digest, previous_digest, at, note, details FROM alias_events "
                "WHERE name = ? ORDER BY id", name)]


def alias_history(reader: DriverReader, aliases: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each of *aliases* with its moves, as `show` prints them."""
    return {name: [{"digest": e.digest, "previous": e.previous_digest, "at": e.at.isoformat(),
                    "note": e.note, "details": e.details} for e in alias_moves(reader, name)]
            for name in aliases}


def rollback_pins(reader: DriverReader, aliases: list[str]) -> list[dict[str, Any]]:
    """The rollbacks that pin any of *aliases*, in their order."""
    pins = []
    for name in aliases:
        moves = alias_moves(reader, name)
        pin = rollback_pin(name, moves[-1] if moves else None, reader.get_alias(name))
        if pin is not None:
            pins.append(pin.as_dict())
    return pins


def warm_caches(reader: DriverReader, artifact: dict[str, Any]) -> list[dict[str, Any]]:
    """The warm caches captured for *artifact* (a `listed_rows` row) that are not deleted."""
    return [{name: row[name] for name in ("digest", "status", "gpu", "toolchain", "size",
                                          "created_at")}
            for row in listed_rows(reader, model=artifact["model"], kind="warm-cache")
            if (row["labels"] or {}).get("artifact") == artifact["digest"]
            and row["status"] != "deleted"]


def stage_run(reader: DriverReader, key: str | None) -> dict[str, Any] | None:
    """The stage run that made an artifact of *key*, as `show` prints it (no recipe)."""
    rows = reader.rows("SELECT status, host, node_id, pid, started_at, finished_at, "
                       "log_location FROM stage_runs WHERE key = ?", key) if key else []
    if not rows:
        return None
    status, host, node_id, pid, started_at, finished_at, log = rows[0]
    return {"status": status, "host": host, "node_id": node_id, "pid": pid,
            "started_at": utc_text(started_at), "finished_at": utc_text(finished_at),
            "log": log}


@dataclass(frozen=True)
class _Evidence:
    digest: str
    status: str
    status_reason: str | None
    toolchain: dict[str, Any]


def refit_equivalence(reader: DriverReader, artifact: dict[str, Any]) -> dict[str, Any] | None:
    """A weight-stripped engine's refit source and whether the refit-equivalence evidence
    of its (model, quant, TRT-LLM) on its GPU holds; None for other artifacts."""
    labels = artifact["labels"] or {}
    if labels.get("strip_plan") is not True:
        return None
    tuple_of = {"model": artifact["model"], "quant": artifact["quant"], "gpu": artifact["gpu"],
                "trtllm": (artifact["toolchain"] or {}).get("trtllm")}
    candidates = [_Evidence(row["digest"], row["status"], row["status_reason"],
                            row["toolchain"] or {})
                  for row in listed_rows(reader, model=tuple_of["model"], gpu=tuple_of["gpu"],
                                         kind=KIND, quant=tuple_of["quant"])]
    found = newest_equivalence(candidates, tuple_of["trtllm"])
    reason = held_back(found, **tuple_of)
    return {"refit_source": labels.get("refit_source"),
            "evidence": None if found is None else found.digest,
            "holds": reason is None, "held_back": reason}
