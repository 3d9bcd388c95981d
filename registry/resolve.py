"""Resolve: which artifact should a node with this GPU serve? Pure ranking, no I/O.

Order (DESIGN §5): compiled engines for the exact GPU SKU first, then TRT-LLM PyTorch-backend
checkpoints, then vLLM entries (the fallback that always runs); within a kind the higher smoke
throughput wins, then the newer artifact. Every artifact that is not a candidate gets a reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from registry.gpus import GpuSpec, quant_supported

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from registry.context import Context

KIND_ORDER: Final = ("trtllm-engine", "trtllm-checkpoint", "vllm")
PREFER: Final = {"engine": "trtllm-engine", "checkpoint": "trtllm-checkpoint", "vllm": "vllm"}
# Toolchain parts an engine must share with the node that loads it.
ENGINE_TOOLCHAIN: Final = ("trtllm", "tensorrt")


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
    toolchain: Mapping[str, Any] = field(default_factory=dict)
    tokens_per_s: float | None = None  # best smoke throughput, if any report passed


@dataclass(frozen=True)
class Request:
    model: str
    gpu: GpuSpec
    gpu_count: int | None = None  # GPUs on the node; None: do not check tp
    min_seq_len: int | None = None
    min_batch: int | None = None
    prefer: tuple[str, ...] = ()  # "engine", "checkpoint", "vllm": tried in this order first
    toolchain: Mapping[str, Any] = field(default_factory=dict)  # the node's, if known


@dataclass(frozen=True)
class Ranked:
    candidates: list[Candidate]
    rejected: list[tuple[Candidate, str]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidates": [_describe(c) for c in self.candidates],
            "rejected": [{**_describe(c), "reason": reason} for c, reason in self.rejected],
        }


def _describe(candidate: Candidate) -> dict[str, Any]:
    return {
        "digest": candidate.digest,
        "kind": candidate.kind,
        "gpu": candidate.gpu,
        "quant": candidate.quant,
        "tp": candidate.tp,
        "max_batch_size": candidate.max_batch_size,
        "max_seq_len": candidate.max_seq_len,
        "status": candidate.status,
        "tokens_per_s": candidate.tokens_per_s,
        "created_at": candidate.created_at.isoformat(),
    }


def rejection(  # noqa: PLR0911 - one return per rule reads best
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
    if request.gpu_count is not None and candidate.tp > request.gpu_count:
        return f"needs tp {candidate.tp}, node has {request.gpu_count} GPUs"
    if request.min_seq_len and (candidate.max_seq_len or 0) < request.min_seq_len:
        return f"shape too small: max_seq_len {candidate.max_seq_len} < {request.min_seq_len}"
    if request.min_batch and (candidate.max_batch_size or 0) < request.min_batch:
        return f"shape too small: max_batch_size {candidate.max_batch_size} < {request.min_batch}"
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
    accepted.sort(
        key=lambda c: (priority[c.kind], -(c.tokens_per_s or 0.0), -c.created_at.timestamp())
    )
    return Ranked(accepted, rejected)


def candidates_for(
    session: Session, model: str, *, every_status: bool, gpu: str | None = None
) -> list[Candidate]:
    """The servable artifacts of *model*: only `ready` ones, and only engines built for
    *gpu*, unless *every_status* (then everything not deleted, for --explain). One indexed
    query on `artifacts` alone: the best passing smoke throughput is kept on the row
    (`best_tokens_per_s`), so no report is read."""
    from sqlalchemy import Table, or_, select

    from registry.models import Artifact

    table: Table = Artifact.__table__  # type: ignore[assignment]
    query = select(*(table.c[name] for name in _COLUMNS)).where(
        table.c.model == model, table.c.kind.in_(KIND_ORDER)
    )
    if every_status:
        query = query.where(table.c.status != "deleted")
    else:
        query = query.where(table.c.status == "ready")
        if gpu is not None:
            query = query.where(or_(table.c.kind != "trtllm-engine", table.c.gpu == gpu))
    return [
        Candidate(
            digest=r.digest, kind=r.kind, model=r.model, status=r.status,
            created_at=r.created_at, gpu=r.gpu, quant=r.quant, kv_cache_dtype=r.kv_cache_dtype,
            tp=r.tp, max_batch_size=r.max_batch_size, max_seq_len=r.max_seq_len,
            toolchain=r.toolchain or {}, tokens_per_s=r.best_tokens_per_s,
        )
        for r in session.execute(query)
    ]


_COLUMNS: Final = (
    "digest", "kind", "model", "status", "created_at", "gpu", "quant", "kv_cache_dtype", "tp",
    "max_batch_size", "max_seq_len", "toolchain", "best_tokens_per_s")


def local_gpu() -> tuple[GpuSpec, int]:
    """This machine's GPU (through the catalog) and how many it has, from nvidia-smi."""
    import shutil
    import subprocess

    from registry.errors import UsageError
    from registry.gpus import UnknownGpuError, lookup_gpu

    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise UsageError("--gpu auto reads nvidia-smi, which is not on this machine; "
                         "pass --gpu SKU (e.g. --gpu h100)")
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], check=True,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"nvidia-smi failed ({exc}); pass --gpu SKU") from exc
    names = [line.strip() for line in out.splitlines() if line.strip()]
    if not names:
        raise UsageError("nvidia-smi lists no GPU; pass --gpu SKU")
    try:
        return lookup_gpu(names[0]), len(names)
    except UnknownGpuError as exc:
        raise UsageError(f"nvidia-smi reports {names[0]!r}, which the catalog lacks") from exc


def resolve(
    ctx: Context, request: Request, *, explain: bool = False
) -> Ranked:
    """Rank the registry's artifacts of *request.model* for *request.gpu*."""
    with ctx.registry.session(readonly=True) as session:
        found = candidates_for(session, request.model, every_status=explain,
                               gpu=request.gpu.sku)
    return rank(found, request)
