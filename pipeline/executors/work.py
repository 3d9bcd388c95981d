"""Running one stage: materialised inputs in, a validated output directory and its labels out.

External programs run through `pipeline.host.runner`; every output is checked against
what the target asked for before anything is published (a rank missing, a build config that
is not the target's shape or plugin settings, a quantized config whose `rotary_base` drifted
from the model's).

The tokenizer travels with the weights: a TRT-LLM checkpoint (convert, or quantize with the
TRT-LLM export) gets `tokenizer/` holding the source model's HF `config.json`, its tokenizer
files and chat template (its own `config.json` is TRT-LLM's), and an engine copies that
`tokenizer/` from its checkpoint. trtllm-serve is started with `--tokenizer <engine>/tokenizer`:
it loads the model config from the tokenizer path with transformers' AutoConfig, which an
engine's own config.json is not.

An engine build starts from its pool's TensorRT timing cache and stores the one trtllm-build
wrote (`pipeline.stages.timing_cache`); those flags are added here, at run time, so the cache
never enters the build key, and nothing about it fails the build.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import StageError
from pipeline.host.runner import log_tail, run_process
from pipeline.planning.plan import Plan, PlannedTarget
from pipeline.planning.stage_run import StageRun
from pipeline.settings import Settings
from pipeline.stages.build import plugin_mismatches
from pipeline.stages.refit import SOURCE_LABEL, STRIP_LABEL, is_stripped
from pipeline.stages.snapshot import snapshot
from pipeline.stages.timing_cache import for_build
from registry.store.base import Store
from registry.tokenizer import HF_CONFIG, TOKENIZER_DIR, TOKENIZER_FILES

ENTRY_FILE = "enginectl-entry.json"


@dataclass(frozen=True)
class StageJob:
    plan: Plan
    run: StageRun
    settings: Settings
    inputs: dict[str, Path]  # input key -> local directory with its files
    input_digests: tuple[str, ...]
    log_path: Path
    store: Store | None = None  # an engine build's TensorRT timing cache is kept there
    s3_endpoint_url: str | None = None  # an s3:// model source's endpoint (the registry's)


@dataclass(frozen=True)
class StageResult:
    directory: Path
    labels: dict[str, Any]
    serve: dict[str, Any] | None = None


def _target(job: StageJob) -> PlannedTarget:
    first = job.run.targets[0]
    return next(t for t in job.plan.targets if t.target.id == first)


def _labels(job: StageJob) -> dict[str, Any]:
    """What the registry lists this artifact under; shared runs take what they share."""
    run, target = job.run, _target(job).target
    labels: dict[str, Any] = {"model": job.plan.loaded.recipe.model.name}
    params = run.params
    if run.stage == "quantize":
        labels |= {"quant": params["quant"], "kv_cache_dtype": params["kv_cache_dtype"],
                   "tp": params.get("tp", 1), "pp": params.get("pp", 1)}
    elif run.stage == "convert":
        labels |= {"quant": target.quant, "tp": params["tp"], "pp": params["pp"]}
    elif run.stage == "build":
        shape = target.shape
        labels |= {
            "runtime": target.runtime, "quant": target.quant,
            "kv_cache_dtype": target.kv_cache_dtype, "tp": target.tp, "pp": target.pp,
            "max_batch_size": shape.max_batch_size, "max_input_len": shape.max_input_len,
            "max_seq_len": shape.max_seq_len, "max_num_tokens": shape.max_num_tokens,
        }
        if run.kind == "trtllm-engine":
            labels |= {"gpu": target.gpu.sku, "sm": target.gpu.sm}
        if run.kind == "trtllm-engine" and is_stripped(params["flags"]):  # its refit source
            labels |= {STRIP_LABEL: True, SOURCE_LABEL: job.input_digests[0]}
    return labels


def _fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _run_tool(job: StageJob, out: Path, timeout_s: float, extra: Sequence[str] = ()) -> None:
    argv = job.run.make_argv(lambda key: job.inputs[key], out)
    if argv is None:
        raise StageError(job.run.stage, job.run.key, "no program to run")
    result = run_process([*argv, *extra], log_path=job.log_path, timeout_s=timeout_s)
    if not result.ok:
        why = "timed out" if result.timed_out else f"{argv[0]} exited {result.returncode}"
        raise StageError(job.run.stage, job.run.key, why, target=job.run.targets[0],
                         log_path=job.log_path, log_tail=log_tail(job.log_path))


def _copy_tokenizer(source: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (out / name).exists():
            shutil.copy2(source / name, out / name)


def _write_tokenizer_dir(job: StageJob, hf_model: Path, out: Path) -> None:
    """`out/tokenizer/`: the HF model's config.json and tokenizer files, for trtllm-serve's
    --tokenizer (a TRT-LLM checkpoint's own config.json is not an HF one)."""
    if not (hf_model / HF_CONFIG).is_file():
        raise StageError(job.run.stage, job.run.key,
                         f"{hf_model} has no {HF_CONFIG}: the engine could not be served "
                         "with its model's tokenizer and config")
    target = out / TOKENIZER_DIR
    target.mkdir(exist_ok=True)
    shutil.copy2(hf_model / HF_CONFIG, target / HF_CONFIG)
    _copy_tokenizer(hf_model, target)


def _carry_tokenizer_dir(job: StageJob, checkpoint: Path, out: Path) -> None:
    """An engine takes its checkpoint's `tokenizer/` (written by convert or quantize)."""
    source = checkpoint / TOKENIZER_DIR
    if not (source / HF_CONFIG).is_file():
        raise StageError(job.run.stage, job.run.key,
                         f"the checkpoint {checkpoint} has no {TOKENIZER_DIR}/{HF_CONFIG}; "
                         "rebuild it (`enginectl build` makes its convert or quantize anew)",
                         target=job.run.targets[0], log_path=job.log_path)
    shutil.copytree(source, out / TOKENIZER_DIR, dirs_exist_ok=True)


def _read_json(path: Path, job: StageJob) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(job.run.stage, job.run.key, f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise StageError(job.run.stage, job.run.key, f"{path} is not a JSON object")
    return data


def _check_ranks(job: StageJob, out: Path, suffix: str, world: int) -> None:
    found = sorted(p.name for p in out.glob(f"rank*{suffix}"))
    wanted = [f"rank{n}{suffix}" for n in range(world)]
    if found != wanted:
        raise StageError(job.run.stage, job.run.key,
                         f"{out} has {found or 'no rank files'}, expected {wanted}",
                         target=job.run.targets[0], log_path=job.log_path)


def _serve_template(job: StageJob) -> dict[str, Any] | None:
    """The argv of the server its smoke run starts, with {model_dir} and {port} left open."""
    smoke = next((r for r in job.plan.stages.values()
                  if r.stage == "smoke" and r.inputs == [job.run.key]), None)
    if smoke is None:
        return None
    argv = smoke.make_argv(lambda _key: Path("{model_dir}"), Path("{out}"))
    model_dir = "self" if job.run.kind == "trtllm-engine" else "input"
    return {"argv": argv, "model_dir": model_dir}


def produce_output(job: StageJob) -> StageResult:
    run, out = job.run, job.run.workdir / "out"
    loaded = job.plan.loaded
    if run.stage == "snapshot":
        directory = snapshot(loaded, job.plan.source.revision,
                             _fresh(out) if not loaded.recipe.model.is_local else out, run.key,
                             s3_endpoint_url=job.s3_endpoint_url)
        return StageResult(directory, _labels(job))
    (source,) = (job.inputs[key] for key in run.inputs)
    if run.stage in ("quantize", "convert"):
        timeout = (loaded.recipe.quantize.timeout_s if run.stage == "quantize"
                   else loaded.recipe.build.timeout_s)
        _run_tool(job, _fresh(out), timeout)
        if run.stage == "convert" or run.params["export"] == "trtllm":
            config = _read_json(out / "config.json", job)
            mapping = config.get("mapping") or {}
            world = int(mapping.get("world_size") or run.params.get("tp", 1)
                        * run.params.get("pp", 1))
            _check_ranks(job, out, ".safetensors", world)
            _write_tokenizer_dir(job, source, out)
        elif not (out / "config.json").is_file():
            raise StageError(run.stage, run.key, f"{out} has no config.json")
        _copy_tokenizer(source, out)
        return StageResult(out, _labels(job))
    if run.kind == "trtllm-engine":
        return _build_engine(job, source, out)
    entry = _fresh(out) / ENTRY_FILE
    serve = _serve_template(job)
    entry.write_text(json.dumps({"runtime": run.params["runtime"], "params": run.params,
                                 "serve": serve}, indent=2, sort_keys=True) + "\n")
    return StageResult(out, _labels(job), serve)


def _build_engine(job: StageJob, checkpoint: Path, out: Path) -> StageResult:
    run, target = job.run, _target(job).target
    toolchain = job.plan.toolchains.for_gpu(target.gpu.sku)
    cache = for_build(job.store, target.gpu, toolchain.tensorrt, run.workdir,
                      python=job.settings.python, log_path=job.log_path, cuda=toolchain.cuda,
                      argv=run.make_argv(lambda key: job.inputs[key], out) or ())
    _run_tool(job, _fresh(out), job.plan.loaded.recipe.build.timeout_s, extra=cache.flags())
    cache.publish()
    config = _read_json(out / "config.json", job)
    build = config.get("build_config") or {}
    shape = target.shape
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"):
        wanted = getattr(shape, name)
        if wanted is not None and build.get(name) != wanted:
            raise StageError(run.stage, run.key,
                             f"engine build_config {name} is {build.get(name)!r}, the target "
                             f"asked for {wanted}", target=target.id, log_path=job.log_path)
    wrong = plugin_mismatches(run.params["flags"], build)
    if wrong:  # trtllm-build overrode a plugin feature the key says the engine has
        raise StageError(run.stage, run.key, f"engine build_config {'; '.join(wrong)}",
                         target=target.id, log_path=job.log_path)
    _check_ranks(job, out, ".engine", target.tp * target.pp)
    _copy_tokenizer(checkpoint, out)
    _carry_tokenizer_dir(job, checkpoint, out)
    return StageResult(out, _labels(job), _serve_template(job))
