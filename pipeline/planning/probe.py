"""This machine's toolchain fingerprint, each field read where it lives (`probe`): nvidia-smi
for the GPU, its driver and the CUDA the driver runs; the builder's Python (ENGINECTL_PYTHON)
for the image's CUDA toolkit, TensorRT, TRT-LLM, modelopt, torch and transformers; vLLM's own
Python for vLLM. `pipeline.planning.toolchain` says what a fingerprint is and what each
stage's key takes of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pipeline.planning.toolchain import Toolchain
from pipeline.planning.versions import cuda_release, fingerprint_version
from registry.errors import UsageError
from registry.gpus import GpuSpec

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.settings import Settings


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
