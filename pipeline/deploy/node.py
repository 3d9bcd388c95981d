"""What a node asks for when it pulls or serves: the resolve request for this node
(`node_request`, `model_request`) and the candidate resolve ranks first for it (`resolved`), or, for
an alias, the target that runs on this node's toolchain (`fitting_target`). Decided before
anything is downloaded; `pipeline.deploy.pull.select` puts them together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from registry.errors import UsageError
from registry.sql.lookup import Found

if TYPE_CHECKING:
    from pipeline.planning.toolchain import Toolchain
    from registry.context import Context
    from registry.gpus import GpuSpec
    from registry.ops.resolve import Request
    from registry.progress import Progress


def node_request(model: str, gpu: str | GpuSpec, *, gpu_count: int | None = None,
                 min_seq_len: int | None = None, min_batch: int | None = None,
                 prefer: Sequence[str] = (), allow_unproven: bool = False,
                 ctx: Context | None = None) -> Request:
    """The resolve request for this node: *gpu* "auto" reads nvidia-smi and this node's
    fingerprint (`_installed_toolchain`: the proofs are compared with it, and an engine must
    match its TRT-LLM and TensorRT), else a catalog name (only the SKU is known).
    *allow_unproven* (`--allow-unproven`) also ranks what has no passing proof on the SKU.
    With *ctx*, "auto" on a machine without nvidia-smi suggests `--gpu cpu` when *model* has
    an entry proven on the CPU (`_cpu_hint`)."""
    from pipeline.errors import NoNvidiaSmiError
    from pipeline.planning.probe import local_gpu
    from registry.gpus import GpuSpec, lookup_gpu
    from registry.ops.resolve import Request

    toolchain: dict[str, Any] = {}
    if isinstance(gpu, GpuSpec):
        spec = gpu
    elif gpu == "auto":
        try:
            spec, counted = local_gpu()
        except NoNvidiaSmiError as exc:
            hint = None if ctx is None else _cpu_hint(ctx, model)
            if hint is None:
                raise
            raise NoNvidiaSmiError(hint) from exc
        gpu_count = gpu_count or counted
        toolchain = _installed_toolchain()
    else:
        spec = lookup_gpu(gpu, option="--gpu")
    return Request(model=model, gpu=spec, gpu_count=gpu_count, min_seq_len=min_seq_len,
                   min_batch=min_batch, prefer=tuple(prefer), toolchain=toolchain,
                   allow_unproven=allow_unproven)


def _cpu_hint(ctx: Context, model: str) -> str | None:
    """`pass --gpu cpu: …` when the registry has an entry of *model* that resolve would pull
    on the CPU (ready, proven there), else None; a registry that cannot say is None too."""
    from registry.errors import RegistryError, UsageError
    from registry.gpus import lookup_gpu
    from registry.ops.resolve import Request, resolve

    try:
        ranked = resolve(ctx, Request(model=model, gpu=lookup_gpu("cpu")))
    except (RegistryError, UsageError):  # no registry, an unknown model: the plain message
        return None
    if not ranked.candidates:
        return None
    return (f"{model} has a vLLM entry proven on the CPU ({ranked.candidates[0].digest[:19]}…): "
            "pass --gpu cpu to serve it here, or --gpu SKU")


@dataclass(frozen=True)
class NodeOptions:
    """The rarer choices of `pull` and `serve` alike (the CLI's options of the same names)."""

    gpu_count: int | None = None  # --gpu-count: the node's GPUs of the SKU (default: counted)
    min_batch: int | None = None  # --min-batch
    prefer: tuple[str, ...] = ()  # --prefer: runtimes or quantizations resolve ranks first
    allow_unready: bool = False  # --allow-unready: a REF that is not ready or superseded
    allow_unproven: bool = False  # --allow-unproven: one proven only on another SKU
    progress: Progress | None = None  # the download's progress bar
    warm: bool = True  # False (--no-warm): leave the warm cache out


def model_request(verb: str, ref: str | None, model: str | None, gpu: str | GpuSpec, *,
                  min_seq_len: int | None = None, options: NodeOptions = NodeOptions(),
                  ctx: Context | None = None) -> Request | None:
    """What `pull` or `serve` (*verb*) was asked for: None for a REF, else the resolve request
    for *model* on this node (`node_request`). Both, or neither, is a `UsageError`."""
    if (ref is None) == (model is None):
        raise UsageError(f"{verb} takes a REF or --model, not both")
    return None if model is None else node_request(
        model, gpu, gpu_count=options.gpu_count, min_seq_len=min_seq_len,
        min_batch=options.min_batch, prefer=options.prefer,
        allow_unproven=options.allow_unproven, ctx=ctx)


def installed_toolchain() -> Toolchain:
    """This deploy node's fingerprint (`pipeline.planning.probe.probe`). `pull` and
    `serve` are a node's top and the documented Python API hands them a Context alone, so
    the node's Pythons (ENGINECTL_PYTHON, ENGINECTL_VLLM_PYTHON) are read from its own
    environment here, once per question, as before."""
    from pipeline.planning.probe import probe
    from pipeline.settings import Settings

    return probe(Settings.from_env()).toolchain


def _installed_toolchain() -> dict[str, Any]:
    """The fingerprint fields resolve compares proofs on, as this node reports them."""
    from registry.sql.evidence import FINGERPRINT_FIELDS

    found = installed_toolchain().as_dict()
    return {name: found[name] for name in FINGERPRINT_FIELDS}


def resolved(ctx: Context, request: Request
              ) -> tuple[Found, tuple[str, ...], dict[str, Any] | None, str | None]:
    """The best candidate for *request*, the note to print about it, the proof it was ranked
    by, and how it is unproven here (None when proven on this fingerprint)."""
    from registry.errors import NothingResolvableError
    from registry.ops.resolve import resolve

    ranked = resolve(ctx, request)
    sku = request.gpu.sku
    if not ranked.candidates:
        ranked = resolve(ctx, request, explain=True)  # every reason, and where each is proven
    if not ranked.candidates:
        elsewhere = any(reason.startswith(f"unproven on {sku}") for _, reason in ranked.rejected)
        raise NothingResolvableError(
            request.model, sku, ranked.reasons(),
            next_step=f"`enginectl resolve --model {request.model} --gpu {sku} --explain` "
                      "lists the same; build, smoke or tag one for this GPU"
                      + ("; --allow-unproven takes one proven only elsewhere"
                         if elsewhere and not request.allow_unproven else ""))
    best = ranked.candidates[0]
    note = best.unproven_note(sku)
    notes = () if note is None else (
        f"{best.digest} is {note}; `enginectl smoke {best.digest[:19]}` here proves it",)
    evidence = None if best.used is None else {
        **best.used.as_dict(), "fingerprint": ranked.as_dict()["fingerprint"]}
    return Found(best.digest, best.status), notes, evidence, note


def fitting_target(ctx: Context, ref: str, found: Found) -> tuple[Found, str] | None:
    """For *ref* an alias whose target *found* cannot run on this node's toolchain, the
    alias's most recent earlier target that can, and the one line that says so
    (`registry.ops.alias_fit`); None when *ref* is no alias or its target runs here.
    `AliasToolchainError` (exit 6) when no target of it does. This node is probed only when
    the alias's targets record a toolchain to compare with (on the driver alone, no ORM)."""
    from registry.identity.refs import valid_alias_name

    if found.status is None or not valid_alias_name(ref):
        return None
    from registry.ops.alias_fit import comparable, fit
    from registry.sql.alias_targets import alias_targets

    targets = alias_targets(ctx.config.registry_url, ref, retry_s=ctx.config.registry_retry_s)
    if not comparable(targets):
        return None
    fitted = fit(ref, found.digest, targets, _installed_toolchain())
    return None if fitted is None else (Found(fitted.digest, fitted.status), fitted.note)
