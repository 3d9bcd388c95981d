"""What `resolve` reads from the registry, on the database driver alone (`registry.sql.lookup`'s
reader): SQLAlchemy's ORM costs more to import than a resolve's whole answer, and a
statement through it more CPU than the ranking.

`candidate_rows` reads, in one statement, the servable artifacts of a model (only `ready`
ones, and only engines built for the node's SKU, unless *every_status*: then everything not
deleted, for --explain) with the passing smoke reports on the node's SKU of exactly those
rows, oldest first (never the model's other artifacts; an engine built for another SKU has
no proof on this one to read), and, *with_gpus*, the GPUs each passed a smoke on
(`artifact_evidence`). One statement is one round trip: on PostgreSQL on a busy machine each
costs more than the statement itself. Its shape keeps every read an index probe whatever the
planner's statistics say (a bulk load leaves none):

- the artifacts' columns but the toolchain are all in `ix_artifacts_resolve` (migration
  0004): the rows are a few adjacent index pages; the two toolchain parts an engine must
  match (`ENGINE_TOOLCHAIN`) are read by primary key for the engines built for the node's
  SKU alone (a correlated subquery under a CASE), every other row's parts are None;
- the proofs are an index probe per artifact on `ix_smoke_reports_artifact_id_gpu`: on
  PostgreSQL a LATERAL subquery fenced with OFFSET 0 (else, on a table not analysed yet,
  the planner may hash-join all of `smoke_reports`), on SQLite a LEFT JOIN, which it runs
  as nested loops on that index;
- the fingerprint fields and the throughput are read out of the JSON by the database, as
  `->>` on PostgreSQL (text) and `json_extract` on SQLite (the JSON value).

`known_models`: the models with an artifact that is not deleted (what an unknown model's
error suggests). Reads only, as plain values; `registry.ops.resolve` ranks them.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from typing import Any, Final, NamedTuple

from registry.sql.evidence import FINGERPRINT_FIELDS, Proof
from registry.sql.listing import utc_time
from registry.sql.lookup import DriverReader

SERVABLE: Final = ("trtllm-engine", "trtllm-checkpoint", "vllm")
"""The kinds resolve ranks (`registry.ops.resolve.KIND_ORDER`, which tests hold to this)."""
ENGINE_TOOLCHAIN: Final = ("trtllm", "tensorrt")
"""The toolchain parts an engine must share with the node that loads it."""
_PARAMETER: Final = re.compile(r":(model|gpu)\b")


class CandidateRow(NamedTuple):
    """One artifact `candidate_rows` read: its row's columns that resolve ranks by, the
    passing proofs on the node's SKU (oldest first), and where it passed a smoke (None: not
    read). A named tuple: made ~400 times by one --explain, 4x cheaper than a frozen
    dataclass."""

    digest: str
    kind: str
    model: str
    status: str
    created_at: datetime
    gpu: str | None
    quant: str | None
    kv_cache_dtype: str | None
    tp: int
    max_batch_size: int | None
    max_seq_len: int | None
    pp: int | None
    row_id: int
    toolchain: dict[str, Any]  # ENGINE_TOOLCHAIN's parts, None unless an engine for the SKU
    proofs: list[Proof]
    gpus: tuple[str, ...] | None


def candidate_rows(reader: DriverReader, model: str, gpu: str, *, every_status: bool,
                   with_gpus: bool) -> list[CandidateRow]:
    """The candidates of *model* for a node with *gpu* (module doc), in the database's order;
    each one's proofs oldest first (by time, then report id: sorted here, so that no ORDER BY
    steers the planner off the covering index)."""
    postgresql = reader.dialect == "postgresql"
    sql, names = _statement(postgresql, every_status=every_status, with_gpus=with_gpus)
    values = {"model": model, "gpu": gpu}
    found: dict[int, CandidateRow] = {}
    proofs: dict[int, list[tuple[datetime, int, Proof]]] = {}
    for (digest, kind, name, status, created_at, on_gpu, quant, kv, tp, batch, seq, pp,
         row_id, trtllm, tensorrt, gpus, report_id, proved_at, tokens, *fields) in reader.rows(
            sql, *(values[n] for n in names)):
        if row_id not in found:
            found[row_id] = CandidateRow(
                digest, kind, name, status, utc_time(created_at), on_gpu, quant, kv, tp,
                batch, seq, pp, row_id, {"trtllm": trtllm, "tensorrt": tensorrt}, [],
                None if not with_gpus else tuple(  # SQLite: group_concat's text
                    gpus.split("\x1f") if isinstance(gpus, str) else gpus or ()))
        if report_id is not None:
            at = utc_time(proved_at)
            proofs.setdefault(row_id, []).append((at, report_id, Proof(
                digest, gpu, at, tokens, dict(zip(FINGERPRINT_FIELDS, fields, strict=True)))))
    for row_id, passed in proofs.items():
        found[row_id].proofs.extend(proof for _, _, proof in sorted(passed))
    return list(found.values())


def known_models(reader: DriverReader) -> list[str]:
    """The models the registry has an artifact of that is not deleted, sorted (resolve's and
    advise's "is this model known?")."""
    return sorted(str(row[0]) for row in reader.rows(
        "SELECT DISTINCT model FROM artifacts WHERE status <> 'deleted'"))


_SELECT: Final = """SELECT a.digest, a.kind, a.model, a.status, a.created_at, a.gpu, a.quant,
 a.kv_cache_dtype, a.tp, a.max_batch_size, a.max_seq_len, a.pp, a.id,
 CASE WHEN {engine_here} THEN (SELECT {own_trtllm} FROM artifacts own WHERE own.id = a.id) END,
 CASE WHEN {engine_here} THEN (SELECT {own_tensorrt} FROM artifacts own WHERE own.id = a.id) END,
 {gpus}, p.id, p.created_at, {tokens}, {fields}
FROM artifacts a {proofs}
WHERE a.model = :model AND {where}"""
"""`candidate_rows`' statement: its columns in `CandidateRow`'s order, then the proof's."""
_PROOFS: Final = {
    # fenced by OFFSET 0: an index probe per artifact, whatever the statistics
    "postgresql": "LEFT JOIN LATERAL (SELECT s.id, s.created_at, s.report, s.toolchain FROM "
                  "smoke_reports s WHERE {passed}\n OFFSET 0) p ON true",
    "sqlite": "LEFT JOIN smoke_reports p ON {passed}",
}
# a passing report on the node's SKU; an engine built for another SKU (only --explain reads
# them) has no proof on this one
_PASSED: Final = ("{r}.artifact_id = a.id AND {r}.gpu = :gpu AND {r}.passed IS {true}\n"
                  " AND (a.kind <> 'trtllm-engine' OR a.gpu = :gpu)")
_GPUS: Final = {
    "postgresql": "(SELECT array_agg(e.gpu ORDER BY e.gpu) FROM artifact_evidence e "
                  "WHERE e.artifact_id = a.id)",
    # one text, the names apart by the unit separator (no SKU has it); NULL for none
    "sqlite": "(SELECT group_concat(gpu, char(31)) FROM (SELECT e.gpu FROM artifact_evidence "
              "e WHERE e.artifact_id = a.id ORDER BY e.gpu))",
}
_ENGINE_HERE: Final = "a.kind = 'trtllm-engine' AND a.gpu = :gpu"


@functools.cache
def _statement(postgresql: bool, *, every_status: bool,
               with_gpus: bool) -> tuple[str, tuple[str, ...]]:
    """`candidate_rows`' statement (`_SELECT`) with "?" marks, and the parameter each mark
    takes, in order. Only the fixed texts above are formatted in, never a value."""
    dialect = "postgresql" if postgresql else "sqlite"

    def json_text(column: str, name: str) -> str:
        return (f"{column} ->> '{name}'" if postgresql
                else f"json_extract({column}, '$.\"{name}\"')")

    tokens = json_text("p.report", "best_output_tokens_per_s")
    kinds = " OR ".join(f"a.kind = '{kind}'" for kind in SERVABLE)
    others = " OR ".join(f"a.kind = '{kind}'" for kind in SERVABLE[1:])
    template = _SELECT.format(
        engine_here=_ENGINE_HERE,
        own_trtllm=json_text("own.toolchain", ENGINE_TOOLCHAIN[0]),
        own_tensorrt=json_text("own.toolchain", ENGINE_TOOLCHAIN[1]),
        gpus=_GPUS[dialect] if with_gpus else "NULL",
        tokens=f"CAST({tokens} AS FLOAT)" if postgresql else tokens,
        fields=", ".join(json_text("p.toolchain", name) for name in FINGERPRINT_FIELDS),
        proofs=_PROOFS[dialect].format(passed=_PASSED.format(
            r="s" if postgresql else "p", true="true" if postgresql else "1")),
        # spelled so that each part is an index range on (model, status, kind, gpu)
        where=f"a.status <> 'deleted' AND ({kinds})" if every_status
        else f"a.status = 'ready' AND ({others} OR {_ENGINE_HERE})")
    names = tuple(match.group(1) for match in _PARAMETER.finditer(template))
    return _PARAMETER.sub("?", template), names
