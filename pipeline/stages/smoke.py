"""smoke: serve an artifact with its real server and prove it answers (pipeline.smoke does the
serving; this module decides whether this machine can, and what to serve).

An engine serves itself; a no-build entry serves the checkpoint it names as its input. The
server argv is the one the plan built for the smoke run, with `{port}` chosen at start.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.recipe import SmokeSettings

if TYPE_CHECKING:
    from pipeline.plan import StageRun
    from pipeline.settings import Settings
    from pipeline.smoke import SmokeReport


def unavailable(run: StageRun, settings: Settings, local_gpu: str | None) -> str | None:
    """Why this machine cannot smoke *run* (None when it can)."""
    runtime = str(run.params.get("runtime"))
    if run.gpu == "CPU":
        if runtime != "vllm":
            return "only vLLM entries are served on the CPU"
        python = settings.vllm_python
        if not (Path(python).is_file() or shutil.which(python)):
            return f"vLLM's Python {python!r} is missing (scripts/install-vllm makes one)"
        return None
    if local_gpu != run.gpu:
        return f"it needs a {run.gpu} and this machine has {local_gpu or 'no GPU'}"
    if runtime in ("trtllm", "trtllm-pytorch") and shutil.which("trtllm-serve") is None:
        return "trtllm-serve is not on PATH"
    return None


def run_smoke(
    argv: list[str], *, model_dir: Path, served_name: str, settings: SmokeSettings,
    max_input_len: int, price_per_hour: float | None, log_path: Path, cpu: bool,
    reference: list[tuple[str, str]] | None = None, threshold: float | None = None,
) -> SmokeReport:
    from pipeline.smoke import smoke

    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else None
    if Path(argv[0]).name == "trtllm-serve":
        served_name = argv[1]  # trtllm-serve has no served-name option: it reports MODEL
    return smoke(argv, model_dir=model_dir, served_name=served_name, settings=settings,
                 max_input_len=max_input_len, price_per_hour=price_per_hour,
                 log_path=log_path, env=env, reference=reference, threshold=threshold)


def smoke_artifact(ref: str, *, settings: Settings | None = None) -> tuple[str, SmokeReport]:
    """`enginectl smoke REF`: serve a registered engine or entry here with the argv its
    manifest records, record the report, and move it to `ready` or `quarantined`."""
    import yaml

    from pipeline.settings import Settings
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
        if not model_dir.is_dir():
            fetch_manifest(ctx.store, load_manifest(ctx, source), model_dir, cache=ctx.cache)
        argv = [str(part).replace("{model_dir}", str(model_dir)) for part in serve["argv"]]
        if argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
            argv[0] = settings.vllm_python  # vLLM's environment on this machine
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
        history.record_smoke(
            ctx, digest, report.passed, report.as_dict(),
            status="ready" if report.passed else "quarantined",
            reason=None if report.passed else f"smoke failed: {report.failure}", log=log)
        return digest, report
    finally:
        ctx.close()
