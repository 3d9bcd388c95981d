"""One smoke verdict, for a build's smoke run and for `enginectl smoke REF` alike.

    judged = judge(ctx, settings, SmokeJob(...))   # serve, check, retry cold, classify
    if judged.fault is None:
        conclude(ctx, judged, gpu=..., toolchain=...)  # record, refuse, capture

`judge` decides; both callers (`pipeline.executors.stage` and
`pipeline.serving.smoke_here.smoke_artifact`) hand it what they know, and nothing else
judges a smoke:

- the checks: the recipe's smoke settings, its reference outputs, and for a quantized
  target the share of tokens that must agree (`agreement`): exact for bf16 and fp16;
- the start: from this node's warm cache of the artifact when it has one
  (`pipeline.serving.warm.seed`); a server that fails with it is started again cold in the
  same smoke, and the artifact's verdict is the cold start's. When the cold start passes,
  the cache is refused (`conclude` quarantines it, a status record the bucket keeps, so
  `pull` and `reindex` never place it again); when both fail the cache proves nothing
  either way and stays;
- the machine: a server that could not start for want of its runtime is this machine's
  fault (`machine_fault`), never a verdict on the artifact.

`conclude` records the verdict (`record_verdict`), refuses the cache, and after a pass
captures what the server wrote as the artifact's warm cache (`capture_warm`), which never
fails the smoke.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.stages.serve import trtllm_served_name

if TYPE_CHECKING:
    from pipeline.recipe.schema import SmokeSettings
    from pipeline.serving.smoke import SmokeReport
    from pipeline.serving.warm import Launch
    from pipeline.settings import Settings
    from registry.context import Context

EXACT_QUANTS = ("bf16", "fp16")
# What a server that could not start for want of its runtime says (the ready check's
# message, the log's first exception, its tail): never a property of the artifact.
_MACHINE_FAULTS: Final = re.compile(
    r"cannot start \S+: \[Errno \d+\]"
    r"|No module named '?(?:vllm|tensorrt_llm|tensorrt|torch)\b[\w.]*'?"
    r"|no CUDA-capable device|No CUDA GPUs are available|Found no NVIDIA driver"
    r"|CUDA driver version is insufficient|NVIDIA driver on your system is too old"
    r"|libcuda\.so[.\d]*: cannot open|Failed to initialize NVML"
)


@dataclass(frozen=True)
class SmokeJob:
    """What a smoke serves, and how it is checked."""

    digest: str
    argv: list[str]  # the server's, `{port}` left to fill
    model_dir: Path
    served_name: str
    smoke: SmokeSettings
    quant: str | None  # the artifact's: what `agreement` asks of its reference outputs
    max_input_len: int
    price_per_hour: float | None
    log_path: Path
    cpu: bool
    serving_dir: Path  # where a runtime that keeps caches runs from (`warm.launch`)
    gpus: int = 1  # what it serves on (tp × pp): the price is one GPU's


@dataclass(frozen=True)
class Judged:
    """`judge`'s answer."""

    digest: str
    report: SmokeReport
    fault: str | None  # this machine's fault: record nothing, the status stays
    started: Launch | None  # the start the report is of (a pass captures its caches)
    refused: str | None = None  # the warm cache its server failed with, the cold one passing
    log_path: Path | None = None


def agreement(smoke: SmokeSettings, quant: str | None
              ) -> tuple[list[tuple[str, str]] | None, float | None]:
    """The reference outputs a smoke checks, and the share of their tokens that must agree
    position by position: None (exactly) for bf16 and fp16 and an unknown quantization,
    the recipe's `reference_agreement` for a quantized artifact."""
    reference = [(r.prompt, r.output) for r in smoke.reference] or None
    exact = quant is None or quant in EXACT_QUANTS
    return reference, None if exact else smoke.reference_agreement


def judge(ctx: Context, settings: Settings, job: SmokeJob, *,
          cancelled: Callable[[], bool] = lambda: False) -> Judged:
    """Serve and check *job* (module doc): warm when this node has a cache for it, cold
    again when the warm start fails; *cancelled* says when not to retry."""
    from pipeline.serving.warm import cold, launch, seed

    started = seed(ctx, settings, launch(job.argv, job.serving_dir), job.digest)
    report = _serve(job, started)
    refused = None
    if started is not None and started.seeded is not None and not report.passed \
            and not cancelled() and machine_fault(report) is None:
        seeded, why = started.seeded, report.failure
        started = cold(started)
        report = _serve(job, started)
        note = f"the server failed with warm cache {seeded} ({why}); started cold"
        report = replace(report, warm_refused=note)
        refused = seeded if report.passed else None
    return Judged(job.digest, report, machine_fault(report), started, refused, job.log_path)


def _serve(job: SmokeJob, started: Launch | None) -> SmokeReport:
    """One start of *job*'s server (from *started*), checked; with a seeded cache, the report
    says what the runtime did with it (`warm.observed`, from this start's part of the log)."""
    from pipeline.serving.warm import observed

    offset = job.log_path.stat().st_size if job.log_path.is_file() else 0
    report = run_smoke(job, started=started)
    if started is None or started.seeded is None:
        return report
    return replace(report, warm_use=observed(started.runtime, _read_from(job.log_path, offset)))


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read(16 << 20).decode("utf-8", errors="replace")
    except OSError:
        return ""


def conclude(ctx: Context, judged: Judged, *, gpu: str, toolchain: dict[str, Any],
             key: str | None = None, held: str | None = None) -> str | None:
    """Record *judged* (not a machine's fault) as its artifact's smoke evidence and status
    (a pass *held* back stays `built`: `record_verdict`), refuse the warm cache its server
    failed with, and after a pass capture this start's caches; the captured cache's digest,
    or None."""
    from registry.ops import history

    report, log = judged.report, judged.log_path or judged.report.log_path
    record_verdict(ctx, judged.digest, report, log=log, gpu=gpu, toolchain=toolchain, key=key,
                   held=held)
    if judged.refused is not None:
        with ctx.registry.session() as session:
            history.set_status_and_record(ctx.store, session, judged.refused, "quarantined",
                                          f"refused: {report.warm_refused}, which passed")
        _note(log, f"warm cache {judged.refused} refused: pull will not place it")
    return capture_warm(ctx, judged.digest, judged.started, log=log) if report.passed else None


def _note(log: Path, text: str) -> None:
    with contextlib.suppress(OSError), log.open("a", encoding="utf-8") as out:
        out.write(f"\nenginectl: {text}\n")


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


def record_verdict(ctx: Context, digest: str, report: SmokeReport, *, log: Path,
                   gpu: str, toolchain: dict[str, Any], key: str | None = None,
                   held: str | None = None) -> None:
    """Record *report* as *digest*'s smoke evidence (measured on *gpu* with *toolchain*, with
    its *log*), and move *digest* to `ready` on a pass, `quarantined` on a failure
    (`registry.ops.history.record_smoke`); a pass *held* back (why: a weight-stripped engine
    without refit-equivalence evidence that holds) leaves it `built` with that reason."""
    from registry.ops import history
    from registry.sql.records import ArtifactStatus

    passed: ArtifactStatus = "ready" if held is None else "built"
    history.record_smoke(
        ctx, digest, report.passed, report.as_dict(),
        status=passed if report.passed else "quarantined",
        reason=held if report.passed else f"smoke failed: {report.failure}",
        log=log, gpu=gpu, toolchain=toolchain, key=key)


def run_smoke(job: SmokeJob, *, started: Launch | None = None) -> SmokeReport:
    """Smoke *job*'s server, checked against its recipe's reference outputs as its
    quantization asks (`agreement`); with *started* (`pipeline.serving.warm.launch`), the
    server runs from its serving directory with its caches there, to be captured after a
    pass."""
    from pipeline.serving.smoke import SmokeServer, smoke

    argv = job.argv
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if job.cpu else {}
    if started is not None:
        argv, env = started.argv, {**env, **started.env}
    reference, threshold = agreement(job.smoke, job.quant)
    server = SmokeServer(argv, job.model_dir, answers_to(argv, job.model_dir, job.served_name),
                         job.log_path, env=env or None,
                         cwd=None if started is None else started.cwd,
                         warm_cache=None if started is None else started.seeded)
    return smoke(server, settings=job.smoke, max_input_len=job.max_input_len,
                 price_per_hour=job.price_per_hour, reference=reference, threshold=threshold,
                 gpus=job.gpus)


def capture_warm(ctx: Context, digest: str, started: Launch | None, *, log: Path) -> str | None:
    """After a passing smoke of *digest* started by *started* (`pipeline.serving.warm.seed`):
    publish what its server wrote as its warm cache (`pipeline.serving.warm.capture`); the
    cache's digest, or None. A failure, whatever it is, is noted in *log* and never fails the
    smoke (Ctrl-C still stops it)."""
    from pipeline.serving.warm import capture
    from registry.ops.fetch import load_manifest

    if started is None or started.key is None:
        return None
    notes: list[str] = []
    try:
        found = capture(ctx, started, artifact=digest, labels=load_manifest(ctx, digest).labels,
                        notes=notes)
        if found is not None:
            notes.append(f"warm cache {found} captured")
        elif not notes:
            notes.append("wrote no cache")
    except Exception as exc:  # noqa: BLE001 - a cache is an optimisation: never the verdict
        found = None
        notes.append(f"warm cache not captured: {type(exc).__name__}: {exc}")
    with contextlib.suppress(OSError), log.open("a", encoding="utf-8") as out:
        out.writelines(f"\nenginectl: {note}\n" for note in notes)
    return found


def answers_to(argv: list[str], model_dir: Path, name: str) -> str:
    """The model id the server answers to: *name*, or for trtllm-serve (which has no
    served-name option) what it makes of its model argument."""
    if Path(argv[0]).name != "trtllm-serve":
        return name
    model = argv[1].replace("{model_dir}", str(model_dir))
    return trtllm_served_name(model, is_dir=Path(model).is_dir())
