"""smoke: serve an artifact with its real server and prove it answers (pipeline.smoke does the
serving; this module decides whether this machine can, and what to serve).

An engine serves itself; a no-build entry serves the checkpoint it names as its input. The
server argv is the one the plan built for the smoke run, with `{port}` chosen at start.

Quarantine means the artifact failed. A machine that cannot serve it — no GPU of its SKU,
vLLM's Python without vllm, no `trtllm-serve` — is found out before the server starts
(`unavailable`, `cannot_serve_here`), and a server that dies at start because its runtime is
missing (`No module named 'vllm'`, no CUDA driver) is read as the machine's fault too
(`machine_fault`): the artifact's status stays as it was and the reason is printed. A passing
re-smoke moves a quarantined artifact back to `ready` (`enginectl smoke REF`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pipeline.recipe import SmokeSettings
from pipeline.runtimes import program, vllm_in
from pipeline.stages.serve import trtllm_served_name

if TYPE_CHECKING:
    from pipeline.plan import StageRun
    from pipeline.settings import Settings
    from pipeline.smoke import SmokeReport
    from pipeline.toolchain import Toolchain
    from registry.records import ArtifactRecord

VLLM_MODULE: Final = "vllm.entrypoints.openai.api_server"
# What a server that could not start for want of its runtime says (the ready check's
# message, the log's first exception, its tail): never a property of the artifact.
_MACHINE_FAULTS: Final = re.compile(
    r"cannot start \S+: \[Errno \d+\]"
    r"|No module named '?(?:vllm|tensorrt_llm|tensorrt|torch)\b[\w.]*'?"
    r"|no CUDA-capable device|No CUDA GPUs are available|Found no NVIDIA driver"
    r"|CUDA driver version is insufficient|NVIDIA driver on your system is too old"
    r"|libcuda\.so[.\d]*: cannot open|Failed to initialize NVML"
)


def unavailable(run: StageRun, settings: Settings, local_gpu: str | None) -> str | None:
    """Why this machine cannot smoke *run* (None when it can)."""
    runtime = str(run.params.get("runtime"))
    if run.gpu == "CPU":
        if runtime != "vllm":
            return "only vLLM entries are served on the CPU"
        return vllm_in(settings.vllm_python).problem
    if local_gpu != run.gpu:
        return f"it needs a {run.gpu} and this machine has {local_gpu or 'no GPU'}"
    if runtime in ("trtllm", "trtllm-pytorch") and program("trtllm-serve") is None:
        return "trtllm-serve is not on PATH"
    if runtime == "vllm":
        return vllm_in(settings.vllm_python).problem
    return None


def cannot_serve_here(argv: list[str], record: ArtifactRecord,
                      local_gpu: str | None) -> str | None:
    """Why this machine cannot serve *record* with *argv* (None when it can): its server
    program, vLLM in the Python that would run it, and for an engine its GPU SKU."""
    if argv[1:3] == ["-m", VLLM_MODULE]:
        return vllm_in(argv[0]).problem
    if program(argv[0]) is None:
        return f"{argv[0]!r} is not on PATH"
    if Path(argv[0]).name == "trtllm-serve":
        if record.kind == "trtllm-engine" and record.gpu and local_gpu != record.gpu:
            return (f"the engine is built for a {record.gpu} and this machine has "
                    f"{local_gpu or 'no GPU'}")
        if local_gpu is None:
            return "trtllm-serve needs an NVIDIA GPU and this machine has none"
    return None


def machine_fault(report: SmokeReport) -> str | None:
    """The reason, when *report* failed only because this machine lacks the server's
    runtime: its server never became ready and says so."""
    ready = report.check("ready")
    if report.passed or ready is None or ready.passed:
        return None
    details = ready.evidence or {}
    for text in (ready.message, details.get("cause"), details.get("log_tail")):
        found = _MACHINE_FAULTS.search(str(text or ""))
        if found:
            return f"the server could not start here: {found.group(0)} (log {report.log_path})"
    return None


def run_smoke(
    argv: list[str], *, model_dir: Path, served_name: str, settings: SmokeSettings,
    max_input_len: int, price_per_hour: float | None, log_path: Path, cpu: bool,
    reference: list[tuple[str, str]] | None = None, threshold: float | None = None,
) -> SmokeReport:
    from pipeline.smoke import smoke

    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else None
    if Path(argv[0]).name == "trtllm-serve":  # it has no served-name option
        model = argv[1].replace("{model_dir}", str(model_dir))
        served_name = trtllm_served_name(model, is_dir=Path(model).is_dir())
    return smoke(argv, model_dir=model_dir, served_name=served_name, settings=settings,
                 max_input_len=max_input_len, price_per_hour=price_per_hour,
                 log_path=log_path, env=env, reference=reference, threshold=threshold)


def smoke_artifact(ref: str, *, settings: Settings | None = None) -> tuple[str, SmokeReport]:
    """`enginectl smoke REF`: serve a registered engine or entry here with the argv its
    manifest records, record the report, and move it to `ready` or `quarantined` (a pass
    also clears a quarantine). `MachineError` when this machine cannot serve it: then
    nothing is recorded and its status stays."""
    import yaml

    from pipeline.errors import MachineError
    from pipeline.settings import Settings
    from pipeline.toolchain import probe
    from registry import history, records
    from registry.context import Context
    from registry.errors import UsageError
    from registry.fetch import fetch_manifest, load_manifest
    from registry.refs import resolve_ref

    settings = settings or Settings.from_env()
    ctx = Context()
    try:
        with ctx.registry.session(readonly=True) as session:
            digest = resolve_ref(session, ref)
            record = records.get_artifact(session, digest)
            text = (records.get_recipe_text(session, record.recipe_digest)
                    if record is not None and record.recipe_digest else None)
        manifest = load_manifest(ctx, digest)
        serve = dict(manifest.serve or {})
        if record is None or not serve.get("argv"):
            raise UsageError(f"{digest} records no server argv; only engines and entries "
                             "built by enginectl can be smoke-tested")
        if record.status == "deleted":
            raise UsageError(f"{digest} is deleted")
        source = digest if serve.get("model_dir") == "self" else manifest.inputs[0]
        model_dir = settings.work_dir / "inputs" / source.removeprefix("sha256:")[:16]
        argv = [str(part).replace("{model_dir}", str(model_dir)) for part in serve["argv"]]
        vllm = argv[1:3] == ["-m", VLLM_MODULE]
        if vllm:
            argv[0] = settings.vllm_python  # vLLM's environment on this machine
        here = None if vllm else probe(settings.python).toolchain.gpu
        fix = (f"its status stays {record.status}; fix this machine or smoke it on one that "
               f"can, then rerun `enginectl smoke {digest}`")
        if (reason := cannot_serve_here(argv, record, here)) is not None:
            raise MachineError(f"cannot smoke {digest} here", reason, fix)
        if not model_dir.is_dir():
            fetch_manifest(ctx.store, load_manifest(ctx, source), model_dir, cache=ctx.cache)
        smoke_settings = SmokeSettings()
        if text is not None:  # only the smoke section: the source may not be on this machine
            section = (yaml.safe_load(text) or {}).get("smoke") or {}
            smoke_settings = SmokeSettings.model_validate(section)
        log = settings.work_dir / "smoke" / f"{digest.removeprefix('sha256:')[:16]}.log"
        report = run_smoke(
            argv, model_dir=model_dir, served_name=record.model, settings=smoke_settings,
            max_input_len=record.max_input_len or 128,
            price_per_hour=smoke_settings.gpu_price_per_hour.get(record.gpu or "CPU"),
            log_path=log, cpu=record.gpu is None,
        )
        if (fault := machine_fault(report)) is not None:
            raise MachineError(f"cannot smoke {digest} here", fault, fix)
        measured = _where(settings)  # the evidence says where it was measured
        history.record_smoke(
            ctx, digest, report.passed, report.as_dict(),
            status="ready" if report.passed else "quarantined",
            reason=None if report.passed else f"smoke failed: {report.failure}", log=log,
            gpu=measured.gpu or "CPU", toolchain=measured.as_dict())
        return digest, report
    finally:
        ctx.close()


def _where(settings: Settings) -> Toolchain:
    """This machine's fingerprint (GPU SKU through the catalog; None without a GPU)."""
    import os

    from pipeline.toolchain import probe

    return probe(settings.python, os.environ.get("ENGINECTL_IMAGE_DIGEST")).toolchain
