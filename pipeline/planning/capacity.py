"""Whether a node has the GPUs a run or an artifact needs: tp × pp GPUs of its SKU, on one
node. `shortfall` is the one check; the rest say what is needed and what a node has.

Too few GPUs is the node's fault, never the artifact's. Every path that starts a server or a
GPU stage asks before anything starts, and what is refused exits 3 with the artifact's
status as it was (never smoked, never quarantined):

    local build       engine build and GPU smoke runs (`pipeline.executors.stage`), so also
                      the nightly's rebuilds and re-proofs, which are builds
    enginectl smoke   `pipeline.serving.smoke_here.smoke_artifact`
    serve             `pipeline.deploy.serve.serve`, before the server starts
    Ray build         `pipeline.executors.pools.oversized`: a run asking one node for more
                      GPUs than the largest node of its pool has (Ray would keep it pending
                      forever) is refused before anything is submitted
    plan              `plan_notes` says it ahead, from this node's nvidia-smi

The count is nvidia-smi's (`pipeline.planning.probe.local_gpu`). A node is judged only for work
on its own SKU: one that lists no GPU of the SKU is another matter (a smoke awaits a node of
its SKU, a server says itself why it cannot start), and a CPU target needs no GPU at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pipeline.errors import MachineError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pipeline.planning.plan import Plan
    from pipeline.planning.stage_run import StageRun

CPU: Final = "CPU"


@dataclass(frozen=True)
class NodeGpus:
    """The GPUs of a node: *count* of catalog SKU *sku* (None: none that the catalog knows)."""

    sku: str | None
    count: int
    where: str = "this node"
    source: str = "nvidia-smi"


@dataclass(frozen=True)
class GpuNeed:
    """*gpus* GPUs of *sku* on one node (None: of any SKU, as a no-build entry runs on the
    node's GPUs; "CPU": none), *why* shown after the count."""

    sku: str | None
    gpus: int
    why: str

    @classmethod
    def ranks(cls, sku: str | None, tp: int, pp: int) -> GpuNeed:
        """A server or engine build of tp × pp ranks (none on the CPU)."""
        return cls(sku, 0 if sku == CPU else tp * pp, f"tp {tp} x pp {pp}")


@dataclass(frozen=True)
class Shortfall:
    need: GpuNeed
    node: NodeGpus

    @property
    def reason(self) -> str:
        return (f"needs {self.need.gpus} GPUs ({self.need.why}), {self.node.where} has "
                f"{self.node.count} ({self.node.source})")

    @property
    def fix(self) -> str:
        return f"run it on a node with {self.need.gpus} {self.need.sku or 'GPUs'}"

    def __str__(self) -> str:
        return f"{self.reason}; {self.fix}"

    def error(self, what: str, fix: str | None = None) -> MachineError:
        """The refusal of *what* (exit 3); *fix* replaces the default advice."""
        return MachineError(what, self.reason, fix or self.fix)


def shortfall(need: GpuNeed, node: NodeGpus) -> Shortfall | None:
    """Why *node* cannot hold *need* (None when it can, or when it is not the node's call:
    no GPU needed, or a node without GPUs of that SKU)."""
    if need.gpus <= 0 or node.count <= 0 or need.sku not in (None, node.sku):
        return None
    return Shortfall(need, node) if need.gpus > node.count else None


def on_this_node(sku: str | None, count: int) -> NodeGpus:
    """This node's GPUs from what nvidia-smi listed: *count* of *sku*, or fewer when
    CUDA_VISIBLE_DEVICES names fewer (nvidia-smi lists every GPU whatever it says, a server
    sees only those)."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return NodeGpus(sku, count)
    named = [part for part in visible.split(",") if part.strip()]
    if len(named) >= count:
        return NodeGpus(sku, count)
    return NodeGpus(sku, len(named), source=f"nvidia-smi, CUDA_VISIBLE_DEVICES={visible!r}")


def this_node() -> NodeGpus:
    """This node's GPUs as nvidia-smi lists them (none when it is missing, fails, or lists
    a GPU the catalog lacks). Reads only."""
    from pipeline.planning.probe import local_gpu
    from registry.errors import UsageError

    try:
        spec, count = local_gpu()
    except UsageError:
        return NodeGpus(None, 0)
    return on_this_node(spec.sku, count)


def run_need(plan: Plan, run: StageRun) -> GpuNeed | None:
    """What *run* holds of one node while it runs: tp × pp GPUs of its target's SKU for an
    engine build and a smoke run on a GPU; None for the rest."""
    from pipeline.planning.plan import KIND_ENGINE

    if run.gpu in (None, CPU) or not run.targets:
        return None
    if (run.stage == "build" and run.kind == KIND_ENGINE) or (run.stage == "smoke"
                                                              and run.gpus > 0):
        target = plan.target(run.targets[0])
        return GpuNeed.ranks(target.gpu.sku, target.tp, target.pp)
    return None


def labels_need(labels: Mapping[str, object]) -> GpuNeed:
    """What serving an artifact with these manifest labels needs: tp × pp GPUs, of its
    `gpu` for an engine (entries name none: they run on the node's GPUs, or its CPU)."""
    gpu = labels.get("gpu")
    return GpuNeed.ranks(str(gpu) if gpu else None, _int(labels.get("tp")),
                         _int(labels.get("pp")))


def serving_shortfall(labels: Mapping[str, object]) -> Shortfall | None:
    """Why this node cannot serve an artifact with these manifest labels (None when it
    can). nvidia-smi is asked only when the artifact may need a GPU; an entry names no SKU
    (it may serve on the CPU), so a node that lists no GPU is not judged for it."""
    need = labels_need(labels)
    return None if need.gpus <= 0 else shortfall(need, this_node())


def too_few_gpus(labels: Mapping[str, object]) -> str | None:
    """`serving_shortfall`'s reason, for a caller with advice of its own."""
    short = serving_shortfall(labels)
    return None if short is None else short.reason


def _int(value: object) -> int:
    try:
        return max(1, int(str(value)))
    except ValueError:
        return 1


def plan_notes(plan: Plan, node: NodeGpus) -> list[str]:
    """One line per target of *plan* that *node* lacks the GPUs for (`enginectl plan`)."""
    found = []
    for planned in plan.targets:
        target = planned.target
        short = shortfall(GpuNeed.ranks(target.gpu.sku, target.tp, target.pp), node)
        if short is not None:
            found.append(f"target {target.id}: {short.reason}, so a build here refuses it "
                         f"(exit 3); {short.fix}")
    return found
