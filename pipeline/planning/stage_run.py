"""A stage run: one node of the plan's DAG (`pipeline.planning.plan`), by its key. Plain data,
apart from the function that makes its argv; imports nothing of the recipe's model, so what a
no-op build reads of a remembered plan (`pipeline.planning.plan_cache`) is these."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DirOf = Callable[[str], Path]
ArgvBuilder = Callable[[DirOf, Path], "list[str] | None"]
"""Builds a run's argv from where its inputs are (by key) and its output directory: the plan
shows it with work directories, the executor runs it with the real ones."""


def no_argv(_dirs: DirOf, _out: Path) -> list[str] | None:
    """A run that runs no program of its own (a snapshot, an entry)."""
    return None


@dataclass
class StageRun:
    stage: str
    key: str
    kind: str
    params: dict[str, Any]
    inputs: list[str]
    toolchain: dict[str, Any]
    workdir: Path
    make_argv: ArgvBuilder = field(default=no_argv, repr=False)
    argv: list[str] | None = None  # make_argv with the plan's work directories, for display
    gpu: str | None = None  # the GPU SKU this run must execute on, if any ("CPU": the CPU)
    gpus: int = 0  # how many of that SKU's GPUs it needs on one node
    targets: list[str] = field(default_factory=list)
    before: list[list[str]] = field(default_factory=list)  # shown: programs it runs first

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "key": self.key,
            "kind": self.kind,
            "inputs": self.inputs,
            "params": self.params,
            "toolchain": self.toolchain,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "workdir": str(self.workdir),
            "argv": self.argv,
            "targets": self.targets,
            **({"before": self.before} if self.before else {}),
        }


def keys_of(chains: Iterable[tuple[str, Sequence[str]]], only: str | None) -> set[str]:
    """The keys of the chains of the targets whose id matches the glob *only* (None: all)."""
    keys: set[str] = set()
    for target_id, chain in chains:
        if only is None or fnmatch.fnmatch(target_id, only):
            keys.update(chain)
    return keys
