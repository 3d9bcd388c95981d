"""smoke_here: serve an artifact with its real server and prove it answers
(`pipeline.serving.smoke` does the serving; this module decides whether this machine can and
what to serve; `pipeline.serving.verdict` judges it, for a build and `enginectl smoke` alike).

An engine serves itself; a no-build entry serves the checkpoint it names as its input. The
server argv is the one the plan built for the smoke run, with `{port}` chosen at start.

Quarantine means the artifact failed. A machine that cannot serve it — no GPU of its SKU,
vLLM's Python without vllm, no `trtllm-serve` — is found out before the server starts
(`unavailable`, `cannot_serve_here`), and a server that dies at start because its runtime is
missing (`No module named 'vllm'`, no CUDA driver) is read as the machine's fault too
(`pipeline.serving.verdict.machine_fault`): the artifact's status stays as it was and the
reason is printed. A passing re-smoke moves a quarantined artifact back to `ready`
(`enginectl smoke REF`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.host.runtimes import program, vllm_in
from pipeline.serving.verdict import answers_to
from pipeline.stages.serve import vllm_form

if TYPE_CHECKING:
    from pipeline.deploy.tokenizer import Tokenizer
    from pipeline.planning.stage_run import StageRun
    from pipeline.planning.toolchain import Toolchain
    from pipeline.recipe.schema import SmokeSettings
    from pipeline.serving.smoke import SmokeReport
    from pipeline.settings import Settings
    from registry.context import Context
    from registry.identity.manifest import Manifest
    from registry.sql.records import ArtifactRecord



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
    if vllm_form(argv) is not None:
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


def _fix(digest: str, record: ArtifactRecord) -> str:
    """What to do when this machine cannot smoke *digest* (the error's last part)."""
    return (f"its status stays {record.status}; fix this machine or smoke it on one that "
            f"can, then rerun `enginectl smoke {digest}`")


@dataclass(frozen=True, slots=True)
class Served:
    """How this machine serves a registered engine or entry: the argv (with its model
    directory and tokenizer filled in, `{port}` left), that directory, fetched, and the
    smoke settings of the recipe that made it."""

    digest: str
    record: ArtifactRecord
    argv: list[str]
    model_dir: Path
    served_name: str
    settings: SmokeSettings
    env: dict[str, str] | None


def prepare_served(ctx: Context, ref: str, settings: Settings) -> Served:
    """Find *ref*'s server argv and fetch what it serves (module doc). UsageError for what
    cannot be served; `MachineError` when this machine cannot serve it."""
    import yaml

    from pipeline.deploy.refit import needs_refit, refitted_engine
    from pipeline.errors import MachineError
    from pipeline.planning.capacity import too_few_gpus
    from pipeline.planning.probe import probe
    from registry.errors import UsageError
    from registry.ops.fetch import load_manifest
    from registry.ops.fetch_files import fetch_once
    from registry.sql import build_inputs, records
    from registry.sql.refs import resolve_ref

    with ctx.registry.session(readonly=True) as session:
        digest = resolve_ref(session, ref)
        record = records.get_artifact(session, digest)
        text = (build_inputs.get_recipe_text(session, record.recipe_digest)
                if record is not None and record.recipe_digest else None)
    manifest = load_manifest(ctx, digest)
    serve, tokenizer = _serve_of(ctx, digest, manifest, record)
    if record is None or not serve.get("argv"):
        raise UsageError(f"{digest} records no server argv; only engines and entries "
                         "built by enginectl, and imported engines, can be smoke-tested")
    if record.status == "deleted":
        raise UsageError(f"{digest} is deleted")
    source = digest if serve.get("model_dir") == "self" else manifest.inputs[0]
    model_dir = settings.input_dir(source)
    argv = [str(part).replace("{model_dir}", str(model_dir)) for part in serve["argv"]]
    vllm = vllm_form(argv) is not None
    if vllm:
        argv[0] = settings.vllm_python  # vLLM's environment on this machine
    here = None if vllm else probe(settings).toolchain.gpu
    stripped = needs_refit(manifest)
    no_refit = ("trtllm-refit is not on PATH"
                if stripped and program("trtllm-refit") is None else None)
    if (reason := cannot_serve_here(argv, record, here) or too_few_gpus(manifest.labels)
            or no_refit) is not None:
        raise MachineError(f"cannot smoke {digest} here", reason, _fix(digest, record))
    fetch_once(ctx.store, lambda: load_manifest(ctx, source), model_dir, cache=ctx.cache)
    if stripped:  # served as a node serves it: refitted from its checkpoint
        whole = refitted_engine(ctx, manifest, model_dir,
                                model_dir.with_name(f"{model_dir.name}.refit")).directory
        argv = [part.replace(str(model_dir), str(whole)) for part in argv]
        model_dir = whole
    argv = _with_tokenizer(ctx, tokenizer, argv, model_dir)
    from pipeline.recipe.schema import SmokeSettings  # pydantic: not where a no-op build asks

    smoke_settings = SmokeSettings()
    if text is not None:  # only the smoke section: the source may not be on this machine
        section = (yaml.safe_load(text) or {}).get("smoke") or {}
        smoke_settings = SmokeSettings.model_validate(section)
    return Served(digest, record, argv, model_dir,
                  answers_to(argv, model_dir, record.model), smoke_settings,
                  {"VLLM_CPU_KVCACHE_SPACE": "1"} if record.gpu is None else None)


def smoke_artifact(ref: str, *, ctx: Context, settings: Settings) -> tuple[str, SmokeReport]:
    """`enginectl smoke REF`: serve a registered engine or entry of *ctx*'s registry here
    with the argv its manifest records and judge it as a build's smoke does
    (`pipeline.serving.verdict`: its recipe's reference outputs and agreement, the warm start
    and capture), record the report, and move it to `ready` or `quarantined` (a pass also
    clears a quarantine). `MachineError` when this machine cannot serve it: then nothing is
    recorded and its status stays. The caller made *ctx* and closes it."""
    from pipeline.errors import MachineError
    from pipeline.serving.verdict import SmokeJob, conclude, judge

    served = prepare_served(ctx, ref, settings)
    digest, record = served.digest, served.record
    log = settings.work_dir / "smoke" / f"{digest.removeprefix('sha256:')[:16]}.log"
    judged = judge(ctx, settings, SmokeJob(
        digest, served.argv, served.model_dir, record.model, served.settings,
        record.quant, record.max_input_len or 128,
        served.settings.gpu_price_per_hour.get(record.gpu or "CPU"), log,
        record.gpu is None, log.with_suffix(".serve"),
        gpus=record.tp * record.pp if record.gpu else 1))
    if judged.fault is not None:
        raise MachineError(f"cannot smoke {digest} here", judged.fault, _fix(digest, record))
    measured = _where(settings)  # the evidence says where it was measured
    conclude(ctx, judged, gpu=measured.gpu or "CPU", toolchain=measured.as_dict())
    return digest, judged.report


def _serve_of(ctx: Context, digest: str, manifest: Manifest, record: ArtifactRecord | None
              ) -> tuple[dict[str, Any], Tokenizer | None]:
    """The serve template *manifest* records, and for an engine (an imported one: the plain
    trtllm-serve command) where its tokenizer directory comes from
    (`pipeline.deploy.tokenizer.engine_tokenizer`). UsageError for an engine without one: it
    could answer completions but never chat, and smoke never proves one on completions
    alone."""
    from pipeline.deploy.command import template
    from pipeline.deploy.tokenizer import engine_tokenizer
    from registry.errors import UsageError

    serve = dict(manifest.serve or {})
    if record is None or record.kind != "trtllm-engine":
        return serve, None
    tokenizer = engine_tokenizer(ctx, manifest)
    if tokenizer is None:
        raise UsageError(f"{digest} has no tokenizer directory and no source checkpoint in "
                         "its provenance, so it cannot serve chat and is not smoke-tested; "
                         "re-import it with `enginectl import DIR --kind trtllm-engine "
                         "--tokenizer-from HF_DIR|REF`")
    if not serve.get("argv"):
        found = template(digest, manifest.kind, manifest.labels, None)
        serve = {"argv": list(found.argv), "model_dir": found.model_dir}
    return serve, tokenizer


def _with_tokenizer(ctx: Context, tokenizer: Tokenizer | None, argv: list[str],
                    model_dir: Path) -> list[str]:
    """An engine's *argv* with `--tokenizer <model_dir>/tokenizer`, fetched there from its
    source checkpoint when it does not carry it (one published before engines did)."""
    from registry.identity.manifest import FileEntry, Manifest
    from registry.ops.fetch_files import fetch_once
    from registry.tokenizer import TOKENIZER_DIR

    if tokenizer is None:
        return argv
    where = model_dir / TOKENIZER_DIR
    if tokenizer.source is not None:
        files = tuple(FileEntry(e.path.removeprefix(f"{TOKENIZER_DIR}/"), e.size, e.xxh3,
                                e.sha256) for e in tokenizer.files)
        fetch_once(ctx.store, lambda: Manifest(kind="hf-checkpoint", files=files), where,
                   cache=ctx.cache)
    if "--tokenizer" in argv[:-1]:
        at = argv.index("--tokenizer") + 1
        return [*argv[:at], str(where), *argv[at + 1:]]
    return [*argv, "--tokenizer", str(where)]


def _where(settings: Settings) -> Toolchain:
    """This machine's fingerprint (GPU SKU through the catalog; None without a GPU)."""
    from pipeline.planning.probe import probe

    return probe(settings).toolchain
