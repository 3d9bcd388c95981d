"""Which of an alias's targets a node can run: an alias never sends a node an artifact that
cannot run on its toolchain. Pure: the targets come from `registry.sql.alias_targets`, the
node's fingerprint from its caller (`pipeline.deploy.node`).

A target runs on the node unless something says it cannot: an engine built with another
TensorRT-LLM or TensorRT than the node has, or passing smoke reports that all ran on another
TensorRT / TensorRT-LLM / vLLM version (or CUDA major) than the node's (`RUNTIME_FIELDS`,
per kind). A field the node does not report, or a proof did not record, is not compared; a
target never smoked is not held against the node. When the alias's target does not run
there, the node takes the alias's most recent earlier target that does (`ready`, or
`superseded`: a rollback), said in one line; with none, `AliasToolchainError` (exit 6)
names the toolchain the alias needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from registry.errors import AliasToolchainError
from registry.sql.alias_targets import Target

RUNTIME_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "trtllm-engine": ("tensorrt", "trtllm", "cuda"),
    "trtllm-checkpoint": ("trtllm", "cuda"),
    "vllm": ("vllm",),
}
BUILT_FIELDS: Final = ("trtllm", "tensorrt")  # what an engine's plan is tied to
TAKEN: Final = ("ready", "superseded")  # what a node may be sent in the alias's place


@dataclass(frozen=True)
class Fitted:
    """The target a node takes instead of the alias's current one, and the line that says so."""

    digest: str
    status: str
    note: str


def _same(name: str, theirs: str, ours: str) -> bool:
    if name == "cuda":  # a CUDA minor release runs what its major built
        return theirs.partition(".")[0] == ours.partition(".")[0]
    return theirs == ours


def _moved(name: str, theirs: Any, node: Mapping[str, Any]) -> bool:
    return bool(theirs) and bool(node.get(name)) and not _same(name, str(theirs),
                                                               str(node[name]))


def needs(target: Target, node: Mapping[str, Any]) -> list[str]:
    """What *target* needs that *node* lacks (`trtllm 1.3.0`), or [] when it runs there."""
    fields = [name for name in RUNTIME_FIELDS.get(target.kind, ()) if node.get(name)]
    if not fields:
        return []
    if target.kind == "trtllm-engine":
        built = [f"{name} {target.built[name]}" for name in BUILT_FIELDS
                 if _moved(name, target.built.get(name), node)]
        if built:
            return built
    if not target.proofs or any(not any(_moved(name, proof.get(name), node) for name in fields)
                                for proof in target.proofs):
        return []
    latest = target.proofs[-1]
    return [f"{name} {latest[name]}" for name in fields if _moved(name, latest.get(name), node)]


def comparable(targets: Sequence[Target]) -> bool:
    """Whether any of *targets* records a toolchain a node could differ from (else there is
    no need to ask the node what it has)."""
    return any(record.get(name) for target in targets
               for record in target.proofs for name in RUNTIME_FIELDS.get(target.kind, ())) \
        or any(target.built.get(name) for target in targets if target.kind == "trtllm-engine"
               for name in BUILT_FIELDS)


def fit(alias: str, current: str, targets: Sequence[Target],
        node: Mapping[str, Any]) -> Fitted | None:
    """None when the alias's *current* target runs on *node*'s toolchain (or nothing says
    otherwise); else its most recent earlier target of *targets* (newest first) that does
    (`Fitted`); else `AliasToolchainError`."""
    by_digest = {t.digest: t for t in targets}
    target = by_digest.get(current)
    missing = needs(target, node) if target is not None else []
    if target is None or not missing:
        return None
    have = ", ".join(f"{name} {node[name]}" for name in RUNTIME_FIELDS[target.kind]
                     if node.get(name))
    for earlier in targets:
        if earlier.digest == current or earlier.status not in TAKEN or needs(earlier, node):
            continue
        since = f" since {earlier.since:%Y-%m-%d %H:%M}" if earlier.since else ""
        return Fitted(earlier.digest, earlier.status, (
            f"{alias} points at {current[:19]}…, which needs {', '.join(missing)} (this node "
            f"has {have}); pulling its earlier target {earlier.digest}{since}, which runs "
            "here"))
    raise AliasToolchainError(alias, current, missing, have)
