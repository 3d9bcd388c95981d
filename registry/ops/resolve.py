"""Resolve: which artifact should a node with this GPU serve? Pure ranking, no I/O.

Order (DESIGN §5, §6b): by the evidence nearest the node's fingerprint
(`registry.sql.evidence.nearest`): artifacts proven on the fingerprint the node has now (its SKU,
and every field it reports of the driver and the artifact's runtime) first, then the ones
whose latest proof is on the same SKU and driver branch, then on the same SKU only, then
those with no proof on the SKU at all; all but the first are "unproven" on this fingerprint,
the middle two saying which proof is nearest. The last are not candidates unless the request
allows them (`--allow-unproven`): a node is only handed what passed a smoke on its own SKU,
and one proven only elsewhere (another SKU, the CPU) is rejected as `unproven on <SKU>
(proven on …)`. Within each, compiled engines for the exact SKU
first, then TRT-LLM PyTorch-backend checkpoints, then vLLM entries (the fallback that always
runs); within a kind the higher throughput of *the proof used* (the latest at that match,
never the best ever recorded) wins, then the newer artifact. Throughput measured on another
GPU (a CPU smoke run of a vLLM entry, say) never ranks anything. Every artifact that is not a
candidate gets a reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from registry.gpus import GpuSpec, quant_supported
from registry.sql.evidence import MATCH_FIELDS, NO_PROOF, Used, nearest
from registry.sql.resolving import ENGINE_TOOLCHAIN, SERVABLE, candidate_rows

if TYPE_CHECKING:
    from registry.context import Context
    from registry.sql.lookup import DriverReader

KIND_ORDER: Final = SERVABLE  # engines, then TRT-LLM checkpoints, then vLLM entries
PREFER: Final = {"engine": "trtllm-engine", "checkpoint": "trtllm-checkpoint", "vllm": "vllm"}
UNPROVEN_RANK: Final = 3  # `Candidate.match_rank` of one with no passing proof on the SKU


@dataclass(frozen=True)
class Candidate:
    digest: str
    kind: str
    model: str
    status: str
    created_at: datetime
    gpu: str | None = None
    quant: str | None = None
    kv_cache_dtype: str | None = None
    tp: int = 1
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    pp: int = 1  # pipeline stages: it needs tp × pp GPUs on one node
    toolchain: Mapping[str, Any] = field(default_factory=dict)
    tokens_per_s: float | None = None  # the throughput of the proof used (`used`)
    proven: bool = False  # a smoke report passed on the request's fingerprint
    evidence: tuple[str, ...] | None = None  # GPUs it passed on; None: not read (resolve)
    used: Used | None = None  # the proof it is ranked by, and how near (module doc)
    row_id: int | None = None  # its `artifacts` row, which resolve's later reads go by

    @property
    def match_rank(self) -> int:
        """0 proven on this fingerprint … 3 no proof on this SKU (`evidence.MATCHES`)."""
        return self.used.rank if self.used is not None else 0 if self.proven else UNPROVEN_RANK

    def unproven_note(self, gpu: str) -> str | None:
        """`unproven on H100-SXM5-80GB (proven on CPU)`, `unproven on this fingerprint
        (nearest proof: …)`, or None when proven there."""
        if self.proven:
            return None
        used = self.used
        if used is not None and used.proof is not None:
            by = "same SKU and driver branch" if used.match == "driver branch" else "same SKU"
            return (f"unproven on this fingerprint of {gpu} (nearest proof, {by}, "
                    f"{used.proof.at.date().isoformat()}: {', '.join(used.differs)})")
        if self.evidence is None:  # where else it passed was not read (`resolve`)
            return f"unproven on {gpu} (no passing smoke there)"
        elsewhere = [g for g in self.evidence if g != gpu]
        where = f"proven on {', '.join(elsewhere)}" if elsewhere else "no smoke evidence there"
        return f"unproven on {gpu} ({where})"


@dataclass(frozen=True)
class Request:
    model: str
    gpu: GpuSpec
    gpu_count: int | None = None  # GPUs on the node; None: do not check tp × pp
    min_seq_len: int | None = None
    min_batch: int | None = None
    prefer: tuple[str, ...] = ()  # "engine", "checkpoint", "vllm": tried in this order first
    toolchain: Mapping[str, Any] = field(default_factory=dict)  # the node's, if known
    allow_unproven: bool = False  # also rank what has no passing proof on this SKU


@dataclass(frozen=True)
class Ranked:
    candidates: list[Candidate]
    rejected: list[tuple[Candidate, str]]
    gpu: str | None = None  # the SKU it ranked for
    fingerprint: Mapping[str, Any] = field(default_factory=dict)  # the node's, as compared

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "fingerprint": {"gpu": self.gpu, **self.fingerprint},
            "candidates": [_describe(c, self.gpu) for c in self.candidates],
            "rejected": [{**_describe(c, self.gpu), "reason": reason}
                         for c, reason in self.rejected],
        }

    def reasons(self) -> list[str]:
        """One line per artifact that is not a candidate, and per unproven candidate."""
        lines = [f"{c.digest[:19]}… {c.kind}: {reason}" for c, reason in self.rejected]
        if self.gpu is not None:
            lines += [f"{c.digest[:19]}… {c.kind}: {note}" for c in self.candidates
                      if (note := c.unproven_note(self.gpu)) is not None]
        return lines


def _describe(candidate: Candidate, gpu: str | None) -> dict[str, Any]:
    return {
        "digest": candidate.digest,
        "kind": candidate.kind,
        "gpu": candidate.gpu,
        "quant": candidate.quant,
        "tp": candidate.tp,
        "pp": candidate.pp,
        "max_batch_size": candidate.max_batch_size,
        "max_seq_len": candidate.max_seq_len,
        "status": candidate.status,
        "tokens_per_s": candidate.tokens_per_s,
        "proven": candidate.proven,
        "evidence": list(candidate.evidence or ()),
        "evidence_used": (candidate.used or NO_PROOF).as_dict(),
        "note": None if gpu is None else candidate.unproven_note(gpu),
        "created_at": candidate.created_at.isoformat(),
    }


def rejection(  # noqa: PLR0911, PLR0912 - one return per rule reads best
    candidate: Candidate, request: Request
) -> str | None:
    """Why *candidate* cannot serve *request*, or None if it can."""
    gpu = request.gpu
    if candidate.model != request.model:
        return f"model {candidate.model}, not {request.model}"
    if candidate.kind not in KIND_ORDER:
        return f"{candidate.kind} is an intermediate, not servable"
    if candidate.status != "ready":
        return f"not ready (status {candidate.status})"
    if candidate.kind == "trtllm-engine" and candidate.gpu != gpu.sku:
        return f"GPU mismatch: engine built for {candidate.gpu}, node has {gpu.sku}"
    if candidate.kind == "trtllm-engine":
        for part in ENGINE_TOOLCHAIN:
            theirs, ours = candidate.toolchain.get(part), request.toolchain.get(part)
            if theirs and ours and theirs != ours:
                return f"toolchain mismatch: built with {part} {theirs}, node has {ours}"
    quant, kv = candidate.quant or "bf16", candidate.kv_cache_dtype or "auto"
    runs_here = gpu.is_cpu or quant_supported(quant, kv, gpu.sm)
    if candidate.kind != "trtllm-engine" and not runs_here:
        return f"{gpu.sku} (SM {gpu.sm}) cannot run {quant} with a {kv} KV cache"
    if gpu.is_cpu and candidate.kind != "vllm":
        return "only vLLM entries run on the CPU"
    if request.gpu_count is not None and candidate.tp * candidate.pp > request.gpu_count:
        ranks = f"tp {candidate.tp}" if candidate.pp == 1 else \
            f"tp {candidate.tp} x pp {candidate.pp} = {candidate.tp * candidate.pp} GPUs"
        return f"needs {ranks}, node has {request.gpu_count} GPUs"
    if request.min_seq_len and (candidate.max_seq_len or 0) < request.min_seq_len:
        return f"shape too small: max_seq_len {candidate.max_seq_len} < {request.min_seq_len}"
    if request.min_batch and (candidate.max_batch_size or 0) < request.min_batch:
        return f"shape too small: max_batch_size {candidate.max_batch_size} < {request.min_batch}"
    if candidate.match_rank == UNPROVEN_RANK and not request.allow_unproven:
        return candidate.unproven_note(gpu.sku)
    return None


def rank(candidates: Iterable[Candidate], request: Request) -> Ranked:
    order = [PREFER[p] for p in request.prefer] + list(KIND_ORDER)
    priority = {kind: order.index(kind) for kind in KIND_ORDER}
    accepted, rejected = [], []
    for candidate in candidates:
        reason = rejection(candidate, request)
        if reason is None:
            accepted.append(candidate)
        else:
            rejected.append((candidate, reason))
    accepted.sort(key=lambda c: (c.match_rank, priority[c.kind], -(c.tokens_per_s or 0.0),
                                 -c.created_at.timestamp()))
    return Ranked(accepted, rejected, request.gpu.sku, node_fingerprint(request))


def node_fingerprint(request: Request) -> dict[str, Any]:
    """The fields of the node's fingerprint that proofs are compared on (those it reports)."""
    fields = {name for names in MATCH_FIELDS.values() for name in names}
    return {name: value for name, value in sorted(request.toolchain.items())
            if name in fields and value}


def candidates_for(
    reader: DriverReader, request: Request, *, every_status: bool, evidence: bool,
) -> list[Candidate]:
    """The servable artifacts of *request.model* (`registry.sql.resolving.candidate_rows`:
    only `ready` ones, and only engines built for the node's SKU, unless *every_status*:
    then everything not deleted, for --explain), each ranked by the proof on the SKU nearest
    the node's fingerprint (`registry.sql.evidence.nearest`); with *evidence*, each carrying
    the GPUs it passed on (`Candidate.evidence`), else None."""
    node, sku = request.toolchain, request.gpu.sku
    found = []
    for row in candidate_rows(reader, request.model, sku, every_status=every_status,
                              with_gpus=evidence):
        used = nearest(row.proofs, row.kind, node)
        found.append(Candidate(
            row.digest, row.kind, row.model, row.status, row.created_at, row.gpu, row.quant,
            row.kv_cache_dtype, row.tp, row.max_batch_size, row.max_seq_len, pp=row.pp or 1,
            toolchain=row.toolchain, tokens_per_s=used.proof.tokens_per_s if used.proof else None,
            proven=used.match == "fingerprint", used=used, row_id=row.row_id,
            # --explain: where each passed; else only for the words about the unproven
            evidence=row.gpus if every_status or used.rank == UNPROVEN_RANK else None))
    return found


def resolve(
    ctx: Context, request: Request, *, explain: bool = False
) -> Ranked:
    """Rank the registry's artifacts of *request.model* for *request.gpu* and the node's
    fingerprint (*request.toolchain*: what it reports; with none, every proof on the SKU is
    on "this fingerprint"). Only artifacts with a passing proof on the SKU are candidates,
    unless *request.allow_unproven* (the module doc); with *explain* every artifact, and
    when the words need it (nothing proven on the SKU, or *allow_unproven*) each one with no
    proof there, carries the GPUs it was proven on (`Candidate.evidence`). One statement on
    the database driver (`registry.sql.resolving`, on `Context.reader`); a second only when
    nothing is proven on the SKU (where each passed, for the words) or nothing is found (is
    the model known?).

    A model the registry has no artifact of raises `UnknownModelError` (exit 6, not found,
    with the closest model it does know) instead of an empty ranking: a typo is not
    "nothing is ready"."""
    with ctx.reader.reading() as reader:
        found = candidates_for(reader, request, every_status=explain,
                               evidence=explain or request.allow_unproven)
        if found and all(c.match_rank == UNPROVEN_RANK for c in found) \
                and not explain and not request.allow_unproven:  # the words need them
            found = candidates_for(reader, request, every_status=False, evidence=True)
        if not found:
            from registry.sql.resolving import known_models

            known = known_models(reader)
            if request.model not in known:
                from registry.errors import UnknownModelError

                raise UnknownModelError(request.model, known)
    return rank(found, request)
