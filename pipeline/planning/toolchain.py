"""Toolchain fingerprints, which parts of one each stage's key depends on, and which
fingerprint each target's stages are keyed with.

A **pool** is where stage runs execute: this machine for the local executor (pool
`host:<hostname>`), or the nodes of a Ray cluster that offer one GPU SKU (pool = the SKU).
A build keys every stage with the fingerprint probed on the pool that runs it; `plan` uses
the fingerprint last recorded for that pool (the `toolchains` table), or the builder image's
versions (`BUILDER_IMAGE`) with a note when none is recorded. The recipe's `toolchain` pins go
on top; `rebuild_on` is the policy: which fields force a rebuild.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Final

from pipeline.planning.versions import cuda_release, fingerprint_version
from pipeline.recipe.toolchain_fields import TOOLCHAIN_FIELDS
from registry.errors import UsageError
from registry.gpus import GpuSpec

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.recipe.schema import ToolchainPins
    from pipeline.settings import Settings


@dataclass(frozen=True, slots=True)
class Toolchain:
    gpu: str | None = None
    sm: int | None = None
    driver: str | None = None
    driver_cuda: str | None = None  # the newest CUDA the driver runs (nvidia-smi's banner)
    cuda: str | None = None  # the CUDA toolkit TRT-LLM and torch were built with (the image's)
    tensorrt: str | None = None
    trtllm: str | None = None
    modelopt: str | None = None
    torch: str | None = None
    transformers: str | None = None
    vllm: str | None = None  # as vLLM's own Python has it, local version (+cu128) kept
    vllm_torch: str | None = None  # the torch in vLLM's Python
    vllm_cuda: str | None = None  # torch.version.cuda in vLLM's Python (None: a CPU build)
    vllm_triton: str | None = None  # the Triton in vLLM's Python
    image: str | None = None

    def as_dict(self) -> dict[str, str | int | None]:
        return {name: getattr(self, name) for name in FIELDS}

    def pinned(self, pins: ToolchainPins) -> Toolchain:
        """This toolchain with the recipe's *pins* over it; a vLLM pin without a local version
        (`0.11.0`) keeps the local version found (`0.11.0+cu128`), which the key needs."""
        overrides = {k: v for k, v in pins.model_dump(exclude={"rebuild_on"}).items()
                     if v and not (k == "vllm" and _same_public(self.vllm, v))}
        return replace(self, **overrides)

    def on(self, gpu: GpuSpec) -> Toolchain:
        return replace(self, gpu=gpu.sku, sm=gpu.sm)


FIELDS: Final = tuple(f.name for f in fields(Toolchain))


def _same_public(found: str | None, pinned: str | None) -> bool:
    """Whether *found* is *pinned* with a local version added (`0.11.0+cu128`, `0.11.0`)."""
    return bool(found and pinned and "+" not in pinned and found.partition("+")[0] == pinned)


def from_dict(values: Mapping[str, Any]) -> Toolchain:
    """A Toolchain from `as_dict()`'s output (unknown names are ignored)."""
    return Toolchain(**{name: values.get(name) for name in FIELDS})


@dataclass(frozen=True)
class PoolToolchains:
    """The fingerprint each target's stages are keyed with, by the GPU SKU of the target:
    the pool that runs a target's GPU stages has its own fingerprint (*by_gpu*); every other
    target, and a local build, uses *default*."""

    default: Toolchain
    by_gpu: Mapping[str, Toolchain] = field(default_factory=dict)

    def for_gpu(self, sku: str) -> Toolchain:
        return self.by_gpu.get(sku, self.default)

    def pinned(self, pins: ToolchainPins) -> PoolToolchains:
        return PoolToolchains(self.default.pinned(pins),
                              {sku: tc.pinned(pins) for sku, tc in self.by_gpu.items()})

    def as_dict(self) -> dict[str, Any]:
        return {"default": self.default.as_dict(),
                "pools": {sku: tc.as_dict() for sku, tc in sorted(self.by_gpu.items())}}

# What the TensorRT-LLM 1.2.1 release image ships (see Dockerfile.builder), in the form the
# probe reads it there (pipeline.planning.versions). The image is built FROM
# nvcr.io/nvidia/pytorch:25.12
# (TRT-LLM docker/common/install_tensorrt.sh of the 1.2 era, stored version id 46236905056:
# TRT_VER 10.14.1.48, CUDA_VER 13.1 "align with ... rel-25-12"), whose torch is
# 2.10.0a0+b4e4ee81d3 built with CUDA 13.1 (NGC PyTorch 25.12 release notes); TRT-LLM 1.2.1's
# requirements.txt bounds torch <=2.10.0a0 to take it. The driver (and the CUDA it runs) is
# the host's, and vLLM is not in this image (the vLLM environment is probed where it serves):
# they stay unknown until a pool is probed or the recipe pins them.
BUILDER_IMAGE: Final = Toolchain(
    cuda="13.1",
    tensorrt="10.14.1.48",
    trtllm="1.2.1",
    modelopt="0.37.0",
    torch="2.10.0a0+b4e4ee81d3",
    transformers="4.57.3",
)

# The fingerprint fields each stage's key may take (DESIGN §3). `driver_cuda` is in none: the
# driver version is in every key that depends on the driver, and the CUDA a driver runs is a
# function of its version (its branch), so the field would never change a key on its own.
STAGE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "snapshot": (),
    "quantize": ("modelopt", "torch", "transformers"),
    "convert": ("trtllm",),
    "build:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "build:trtllm-pytorch": ("trtllm",),
    "build:vllm": ("vllm", "vllm_torch", "vllm_cuda", "vllm_triton"),
    "smoke:trtllm": ("gpu", "sm", "driver", "cuda", "tensorrt", "trtllm", "image"),
    "smoke:trtllm-pytorch": ("gpu", "sm", "driver", "cuda", "trtllm", "image"),
    "smoke:vllm": ("gpu", "sm", "driver", "vllm", "vllm_torch", "vllm_cuda", "vllm_triton"),
}
REBUILD_FIELDS: Final = TOOLCHAIN_FIELDS
# vLLM's stages are keyed with what vLLM's own Python has (its torch, that torch's CUDA, its
# Triton: `probe`), never the builder's `torch` and `cuda`; a recipe's `rebuild_on` names
# them all as `vllm`.
_COUNTED_AS: Final = {"vllm_torch": "vllm", "vllm_cuda": "vllm", "vllm_triton": "vllm"}


def key_toolchain(
    toolchain: Toolchain, stage: str, rebuild_on: tuple[str, ...] | list[str] = REBUILD_FIELDS
) -> dict[str, str | int | None]:
    """The part of *toolchain* that goes into a key of *stage* under the rebuild policy.

    GPU SKU and SM always count where a stage depends on them: an engine never moves GPUs.
    """
    values = toolchain.as_dict()
    return {
        name: values[name]
        for name in STAGE_FIELDS[stage]
        if name in ("gpu", "sm") or _COUNTED_AS.get(name, name) in rebuild_on
    }


PACKAGES: Final = {
    "tensorrt": "tensorrt", "trtllm": "tensorrt_llm", "modelopt": "nvidia-modelopt",
    "torch": "torch", "transformers": "transformers",
}
"""The fields read from the distributions of the builder's Python (ENGINECTL_PYTHON), by
distribution name. `vllm` is read from vLLM's own Python (`pipeline.host.runtimes.vllm_in`)."""

# Runs in the builder's Python (any Python 3.8+; it imports nothing of enginectl), as a script
# there or, for this very interpreter, in this process: each distribution's version, and
# torch.version.cuda read by loading torch/version.py alone (importing torch takes seconds).
_ENV_SCRIPT: Final = (
    "import importlib.metadata as m, importlib.util as u, json, site, sys\n"
    "def read(names):\n"
    "    out = {}\n"
    "    for name in names:\n"
    "        try: out[name] = m.version(name)\n"
    "        except m.PackageNotFoundError: out[name] = None\n"
    "    cuda = None\n"
    "    try:\n"
    "        path = m.distribution('torch').locate_file('torch/version.py')\n"
    "        spec = u.spec_from_file_location('_enginectl_torch_version', path)\n"
    "        module = u.module_from_spec(spec)\n"
    "        spec.loader.exec_module(module)\n"
    "        cuda = module.cuda\n"
    "    except Exception: pass\n"
    "    return {'versions': out, 'cuda': cuda, 'python': sys.executable,\n"
    "            'sys_path': sys.path, 'user_site': site.getusersitepackages()}\n"
    "if __name__ == '__main__': print(json.dumps(read(sys.argv[1:])))\n"
)


def _builder_python(python: str, remember: Path | None) -> tuple[dict[str, Any], str | None]:
    """What `_ENV_SCRIPT` finds in *python*, and why it found nothing (or None); with
    *remember*, remembered while nothing *python* has installed changed
    (`pipeline.host.state.remembered_answer`)."""
    import sys

    if remember is None:
        return _ask_builder_python(python)
    from pipeline.host.runtimes import program
    from pipeline.host.state import remembered_answer

    problems: list[str] = []

    def ask() -> dict[str, Any] | None:
        found, problem = _ask_builder_python(python)
        if problem is not None:
            problems.append(problem)
            return None
        return found

    where = sys.executable if python == sys.executable else program(python)
    answer = remembered_answer(remember, "builder", where, ask)
    return (answer, None) if answer is not None else ({}, problems[0] if problems else None)


def _ask_builder_python(python: str) -> tuple[dict[str, Any], str | None]:
    import json
    import sys

    from pipeline.host.runner import capture

    if python == sys.executable:  # the default: ask this interpreter, no subprocess
        scope: dict[str, Any] = {"__name__": "enginectl_env_probe"}
        exec(_ENV_SCRIPT, scope)  # noqa: S102 - our own constant, the script run elsewhere
        found: dict[str, Any] = scope["read"](list(PACKAGES.values()))
        return found, None
    done = capture([python, "-c", _ENV_SCRIPT, *PACKAGES.values()], timeout_s=60)
    if not done.ok:
        why = ("no answer in 60 s" if done.timed_out else
               f"exit {done.returncode}: {' '.join(done.stderr.split())[-200:]}")
        return {}, f"{python} cannot be run ({why})"
    try:
        return json.loads(done.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return {}, f"{python} printed no versions"


@dataclass(frozen=True, slots=True)
class _Smi:
    name: str | None = None
    driver: str | None = None
    driver_cuda: str | None = None
    count: int = 0
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class SmiAnswer:
    """What `nvidia-smi --query-gpu=FIELDS --format=csv,noheader` said: one row per GPU."""

    smi: str | None  # where nvidia-smi is (None: not on PATH)
    rows: list[list[str]] = field(default_factory=list)  # the fields asked, per GPU
    failed: str | None = None  # why it gave no answer: "no answer in 30 s" or "exit N"
    timed_out: bool = False
    stderr: str = ""  # the tail of its stderr, when it failed


def query_gpus(*fields: str) -> SmiAnswer:
    """The one reading of nvidia-smi's GPU list (`--gpu auto`, the probe, this node's GPUs)."""
    import shutil

    from pipeline.host.runner import capture

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return SmiAnswer(None)
    done = capture([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                   timeout_s=30)
    if not done.ok:
        return SmiAnswer(smi, failed="no answer in 30 s" if done.timed_out
                         else f"exit {done.returncode}", timed_out=done.timed_out,
                         stderr=" ".join(done.stderr.split())[-200:])
    rows = [[part.strip() for part in line.split(",")]
            for line in done.stdout.splitlines() if line.strip()]
    return SmiAnswer(smi, rows)


def _nvidia_smi() -> _Smi:
    """GPU name, driver and GPU count from nvidia-smi's query; the CUDA the driver runs from
    its banner (`CUDA Version: 12.9`: what the driver supports, not what the image has)."""
    import re

    from pipeline.host.runner import capture

    answer = query_gpus("name", "driver_version")
    if answer.smi is None:
        return _Smi(problem="nvidia-smi is not on PATH")
    if answer.failed:
        return _Smi(problem=f"nvidia-smi failed ({answer.failed})")
    if not answer.rows:
        return _Smi(problem="nvidia-smi lists no GPU")
    banner = capture([answer.smi], timeout_s=30).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    first = answer.rows[0]
    return _Smi(first[0], first[1], cuda_release(cuda.group(1)) if cuda else None,
                len(answer.rows))


def local_gpu() -> tuple[GpuSpec, int]:
    """This machine's GPU (through the catalog) and how many it has, from nvidia-smi, for
    `--gpu auto`; UsageError (naming --gpu SKU as the way out) when it cannot say."""
    from registry.gpus import UnknownGpuError, lookup_gpu

    answer = query_gpus("name")
    if answer.smi is None:
        from pipeline.errors import NoNvidiaSmiError

        raise NoNvidiaSmiError()
    if answer.failed:
        why = answer.failed if answer.timed_out else f"{answer.failed}: {answer.stderr}"
        raise UsageError(f"nvidia-smi failed ({why}); pass --gpu SKU")
    names = [row[0] for row in answer.rows]
    if not names:
        raise UsageError("nvidia-smi lists no GPU; pass --gpu SKU")
    try:
        return lookup_gpu(names[0]), len(names)
    except UnknownGpuError as exc:
        raise UsageError(f"nvidia-smi reports {names[0]!r}, which the catalog lacks") from exc


@dataclass(frozen=True, slots=True)
class Probe:
    toolchain: Toolchain
    gpu_name: str | None  # what nvidia-smi printed
    gpu_count: int
    note: str | None  # e.g. "no NVIDIA GPU on this machine"
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each field of *toolchain* was read (or looked for, when it is None)."""


def probe(settings: Settings, *, remember: Path | None = None) -> Probe:
    """This machine's fingerprint, each field read where it lives (`Probe.sources`): GPU and
    driver from nvidia-smi's query (the GPU through the catalog), the CUDA the driver runs from
    its banner, the image's CUDA toolkit (torch.version.cuda) and TensorRT, TRT-LLM, modelopt,
    torch and transformers from the builder's Python (ENGINECTL_PYTHON), vLLM from vLLM's
    Python (ENGINECTL_VLLM_PYTHON), the image digest from this process's ENGINECTL_IMAGE_DIGEST
    (on a Ray node, the node's own). With *remember* (a build's directory), vLLM's Python
    is asked only when what it has installed changed (`runtimes.remembered_vllm_in`); the
    rest is asked every time."""
    import os

    from pipeline.host.runtimes import remembered_vllm_in, vllm_in
    from registry.gpus import UnknownGpuError, lookup_gpu

    smi = _nvidia_smi()
    found, problem = _builder_python(settings.python, remember)
    vllm = (vllm_in(settings.vllm_python) if remember is None
            else remembered_vllm_in(settings.vllm_python, remember))
    gpu = sm = None
    note = None
    if smi.name is None:
        note = f"no NVIDIA GPU on this machine ({smi.problem})"
    else:
        try:
            spec = lookup_gpu(smi.name)
            gpu, sm = spec.sku, spec.sm
        except UnknownGpuError:
            note = f"GPU {smi.name!r} is not in the catalog"
    versions = found.get("versions") or {}
    python = found.get("python") or settings.python
    image = os.environ.get("ENGINECTL_IMAGE_DIGEST") or None
    toolchain = Toolchain(
        gpu=gpu, sm=sm, driver=smi.driver, driver_cuda=smi.driver_cuda,
        cuda=cuda_release(found.get("cuda")),
        vllm=None if vllm.version in (None, "?") else vllm.version.strip() or None,
        vllm_torch=fingerprint_version(vllm.torch), vllm_cuda=cuda_release(vllm.cuda),
        vllm_triton=fingerprint_version(vllm.triton), image=image,
        **{part: fingerprint_version(versions.get(dist)) for part, dist in PACKAGES.items()},
    )
    sources = {
        "gpu": smi.problem or "nvidia-smi --query-gpu=name, through the GPU catalog",
        "sm": smi.problem or "the GPU catalog",
        "driver": smi.problem or "nvidia-smi --query-gpu=driver_version",
        "driver_cuda": smi.problem or "nvidia-smi banner (CUDA Version)",
        "cuda": problem or f"torch.version.cuda in {python}",
        **{part: problem or f"{dist} in {python}" for part, dist in PACKAGES.items()},
        "vllm": vllm.problem or f"{vllm.distribution or 'vllm'} in {vllm.path}",
        **{f"vllm_{part}": vllm.problem or f"{what} in {vllm.path}" for part, what in (
            ("torch", "torch"), ("cuda", "torch.version.cuda"), ("triton", "triton"))},
        "image": "ENGINECTL_IMAGE_DIGEST" + ("" if image else " (not set)"),
    }
    return Probe(toolchain, smi.name, smi.count, note, sources)


def local_pool() -> str:
    """The pool name of this machine, for the local executor."""
    import socket

    return f"host:{socket.gethostname()}"


def for_plan(recorded: Toolchain, pins: ToolchainPins) -> tuple[Toolchain, str | None]:
    """What `plan` keys with when *recorded* is a pool's last probe: what `for_build` would
    give there, and a note instead of the error a build would raise for a contradicted pin."""
    try:
        return for_build(recorded, pins), None
    except UsageError as exc:
        found: dict[str, Any] = {k: v for k, v in recorded.as_dict().items()
                                 if v is not None and k not in ("gpu", "sm")}
        return replace(BUILDER_IMAGE, **found).pinned(pins), f"a build there would refuse: {exc}"


def for_build(probed: Toolchain, pins: ToolchainPins) -> Toolchain:
    """The toolchain a build on this machine keys its stages with: what is installed here,
    over the builder image's versions. A recipe pin that this machine contradicts is an
    error: an artifact must never be keyed with a toolchain it was not built with."""
    found: dict[str, Any] = {
        k: v for k, v in probed.as_dict().items() if v is not None and k not in ("gpu", "sm")
    }
    for name, pinned in pins.model_dump(exclude={"rebuild_on"}).items():
        if name == "vllm" and _same_public(found.get(name), pinned):
            continue
        if pinned and found.get(name) not in (None, pinned):
            raise UsageError(
                f"the recipe pins toolchain.{name} {pinned!r}, this machine has "
                f"{found[name]!r}; build where the pin holds, or change the pin"
            )
    return replace(BUILDER_IMAGE, **found).pinned(pins)
