"""The plan: a recipe turned into a DAG of stage runs, each with its key. Pure but for what
the model source says (`pipeline.planning.source`, read once and cached).

Stage runs are shared by key, so work is done once however many targets need it: one
snapshot per model revision, one quantization per (quant, KV dtype, calibration, export,
tp, pp), one convert per (tp, pp, dtype), one build per (GPU, shape, flags, checkpoint).
"Is this key already built?" is the only question the plan asks the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.planning.channels import Channel, channels
from pipeline.planning.keys import short_key, stage_key
from pipeline.planning.memory import Fit, calibration_gpus
from pipeline.planning.source import ModelSource, model_source
from pipeline.planning.stage_run import ArgvBuilder, DirOf, StageRun, keys_of, no_argv
from pipeline.planning.target import Target
from pipeline.planning.targets import plan_targets
from pipeline.planning.toolchain import BUILDER_IMAGE, PoolToolchains, Toolchain, key_toolchain
from pipeline.recipe.reader import LoadedRecipe
from pipeline.recipe.schema import Recipe, TrtllmServe, VllmServe
from pipeline.settings import Settings
from pipeline.stages.build import build_argv, build_flags
from pipeline.stages.convert import convert_argv
from pipeline.stages.quantize import Export, QuantizeSpec, needs_quantize, quantize_argv
from pipeline.stages.refit import REFIT_DIR, refit_argv
from pipeline.stages.serve import VllmServing, trtllm_serve_argv, vllm_argv
from registry.identity.canonical import floats_as_strings
from registry.tokenizer import TOKENIZER_DIR

# What each stage run produces (DESIGN §1 profile kinds and intermediates).
KIND_HF = "hf-checkpoint"
KIND_QUANTIZED = "quantized-checkpoint"
KIND_CONVERTED = "converted-checkpoint"
KIND_ENGINE = "trtllm-engine"
KIND_TRTLLM_CHECKPOINT = "trtllm-checkpoint"
KIND_VLLM = "vllm"
KIND_SMOKE = "smoke-report"
ENTRY_KINDS = {"trtllm": KIND_ENGINE, "trtllm-pytorch": KIND_TRTLLM_CHECKPOINT, "vllm": KIND_VLLM}

@dataclass
class PlannedTarget:
    target: Target
    fit: Fit
    chain: list[str]  # stage keys, source first

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.target.as_dict(),
            "memory": {
                "fits": self.fit.fits,
                "needed_bytes": self.fit.needed_bytes,
                "capacity_bytes": self.fit.capacity_bytes,
                "weights_bytes": self.fit.weights_bytes,
                "kv_cache_bytes": self.fit.kv_bytes,
                "margin_bytes": self.fit.margin_bytes,
                "max_batch_size_that_fits": self.fit.max_batch_size,
            },
            "stages": self.chain,
        }


@dataclass
class Plan:
    loaded: LoadedRecipe
    toolchains: PoolToolchains  # what each target's stages are keyed with, pins applied
    targets: list[PlannedTarget]
    stages: dict[str, StageRun]  # by key, in an order where inputs come first
    channels: list[Channel] = field(default_factory=list)  # the recipe's `promote`, rendered
    _by_id: dict[str, Target] = field(default_factory=dict, repr=False, compare=False)
    source: ModelSource = field(kw_only=True)  # what the model source said when planned

    @property
    def toolchain(self) -> Toolchain:
        """The fingerprint of every target without a pool of its own (a local build's)."""
        return self.toolchains.default

    def is_shared(self, key: str) -> bool:
        return len(self.stages[key].targets) > 1

    def target(self, target_id: str) -> Target:
        """The target named *target_id* (KeyError when the plan has none)."""
        if not self._by_id:
            self._by_id.update((t.target.id, t.target) for t in self.targets)
        return self._by_id[target_id]

    def as_dict(self, built: Callable[[str], bool] = lambda _key: False) -> dict[str, Any]:
        recipe = self.loaded.recipe
        return {
            "recipe": {
                "name": recipe.display_name,
                "path": str(self.loaded.path),
                "digest": self.loaded.digest,
                "model": recipe.model.name,
                "source": recipe.model.source,
                "revision": self.source.revision,
                "toolchain": self.toolchain.as_dict(),
                "pools": {sku: tc.as_dict()
                          for sku, tc in sorted(self.toolchains.by_gpu.items())},
            },
            "targets": [t.as_dict() for t in self.targets],
            "stages": [
                {**run.as_dict(), "built": built(run.key)} for run in self.stages.values()
            ],
            "promote": [channel.as_dict() for channel in self.channels],
        }

    def commands(self) -> list[list[str]]:
        return [argv for run in self.stages.values()
                for argv in [*run.before, *([run.argv] if run.argv is not None else [])]]


class _Planner:
    def __init__(self, loaded: LoadedRecipe, source: ModelSource, settings: Settings,
                 toolchains: PoolToolchains) -> None:
        self.loaded = loaded
        self.source = source
        self.recipe: Recipe = loaded.recipe
        self.settings = settings
        self.toolchains = toolchains
        self.rebuild_on = tuple(self.recipe.toolchain.rebuild_on)
        self.stages: dict[str, StageRun] = {}

    def add(
        self,
        target: Target,
        stage: str,
        *,
        kind: str,
        params: Mapping[str, Any],
        inputs: list[str],
        toolchain: Toolchain,
        toolchain_stage: str,
        argv: ArgvBuilder,
        gpu: str | None = None,
        gpus: int = 0,
    ) -> str:
        params = floats_as_strings(dict(params))
        fingerprint = key_toolchain(toolchain, toolchain_stage, self.rebuild_on)
        key = stage_key(stage, params, inputs, fingerprint)
        run = self.stages.get(key)
        if run is None:
            workdir = self.settings.work_dir / f"{stage}-{short_key(key)}"
            run = StageRun(stage, key, kind, dict(params), sorted(inputs), fingerprint, workdir,
                           argv, argv(self.dir_of, workdir / "out"), gpu, gpus)
            self.stages[key] = run
        if target.id not in run.targets:
            run.targets.append(target.id)
        return key

    def dir_of(self, key: str) -> Path:
        """Where a run's output lands (what the runs after it read), for the shown argv."""
        return self.stages[key].workdir / "out"

    def snapshot(self, target: Target) -> str:
        model = self.recipe.model
        if model.is_local:
            params: dict[str, Any] = {"source": "local", "content": self.source.digest}
        else:
            params = {"source": model.source, "revision": self.source.revision}
        return self.add(
            target, "snapshot", kind=KIND_HF, params=params, inputs=[],
            toolchain=self.toolchains.default, toolchain_stage="snapshot", argv=no_argv,
        )

    def quantize(self, target: Target, source: str, export: Export) -> str:
        recipe, quant = self.recipe, target.quant
        calibration = recipe.quantize.calibration
        calib_identity = (
            {"file": calibration.digest} if calibration.file else {"dataset": calibration.dataset}
        )
        params: dict[str, Any] = {
            "quant": quant,
            "kv_cache_dtype": target.kv_cache_dtype,
            "dtype": recipe.model.dtype,
            "calibration": {
                **calib_identity,
                "samples": calibration.samples,
                "seq_len": calibration.seq_len,
                "batch_size": calibration.batch_size,
            },
            "export": export,
        }
        if quant in ("int4_awq", "w4a8_awq"):
            params["awq_block_size"] = recipe.quantize.awq_block_size
        if export == "trtllm":
            # "tokenizer": the output holds tokenizer/ (the HF config and tokenizer files)
            params |= {"tp": target.tp, "pp": target.pp, "tokenizer": TOKENIZER_DIR}
        return self.add(
            target, "quantize", kind=KIND_QUANTIZED, params=params, inputs=[source],
            toolchain=self.toolchains.for_gpu(target.gpu.sku), toolchain_stage="quantize",
            gpu=target.gpu.sku,
            gpus=calibration_gpus(self.source.architecture, recipe.model.dtype, target.gpu),
            argv=lambda dirs, out: quantize_argv(self.settings.python, QuantizeSpec(
                dtype=recipe.model.dtype, quant=quant, kv_cache_dtype=target.kv_cache_dtype,
                calibration=calibration, calib_path=self.source.calibration_file,
                awq_block_size=recipe.quantize.awq_block_size, export=export, tp=target.tp,
                pp=target.pp), model_dir=dirs(source), output_dir=out),
        )

    def convert(self, target: Target, source: str) -> str:
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[target.quant]
        family = self.source.architecture.family
        params = {"dtype": dtype, "tp": target.tp, "pp": target.pp, "family": family,
                  "tokenizer": TOKENIZER_DIR}  # the output holds tokenizer/ (HF config)
        return self.add(
            target, "convert", kind=KIND_CONVERTED, params=params, inputs=[source],
            toolchain=self.toolchains.for_gpu(target.gpu.sku), toolchain_stage="convert",
            argv=lambda dirs, out: convert_argv(
                self.settings.python, self.settings.trtllm_examples, family=family,
                model_dir=dirs(source), output_dir=out, dtype=dtype, tp=target.tp, pp=target.pp,
                workers=self.recipe.build.workers,
            ),
        )

    def chain(self, target: Target) -> list[str]:
        recipe = self.recipe
        on_gpu = self.toolchains.for_gpu(target.gpu.sku).on(target.gpu)
        ranks = target.tp * target.pp
        keys = [self.snapshot(target)]
        wants_quantize = needs_quantize(target.quant, target.kv_cache_dtype)
        serve_args: dict[str, Any]
        if target.runtime == "trtllm":
            checkpoint = (
                self.quantize(target, keys[0], "trtllm")
                if wants_quantize
                else self.convert(target, keys[0])
            )
            keys.append(checkpoint)
            flags = build_flags(recipe.build, target.shape, target.quant, target.kv_cache_dtype,
                                tp=target.tp, family=self.source.architecture.family)
            entry = self.add(
                target, "build", kind=KIND_ENGINE, params={"runtime": "trtllm", "flags": flags},
                inputs=[checkpoint], toolchain=on_gpu, toolchain_stage="build:trtllm",
                argv=lambda dirs, out: build_argv(
                    checkpoint_dir=dirs(checkpoint), output_dir=out, flags=flags,
                    workers=recipe.build.workers,
                ),
                gpu=target.gpu.sku, gpus=ranks,
            )
            serve = recipe.serve.trtllm or TrtllmServe()
            serve_args = serve.model_dump()
            engine = entry

            def smoke_argv(dirs: DirOf, _out: Path) -> list[str]:
                return trtllm_serve_argv(
                    model_dir=dirs(engine), tokenizer_dir=dirs(engine) / TOKENIZER_DIR,
                    backend="tensorrt",
                    tp=target.tp, pp=target.pp, shape=target.shape, settings=serve,
                )
        elif target.runtime == "trtllm-pytorch":
            checkpoint = self.quantize(target, keys[0], "hf") if wants_quantize else keys[0]
            if checkpoint != keys[0]:
                keys.append(checkpoint)
            serve = recipe.serve.trtllm_pytorch or TrtllmServe()
            serve_args = serve.model_dump()
            pytorch_checkpoint, pytorch_serve = checkpoint, serve

            def smoke_argv(dirs: DirOf, _out: Path) -> list[str]:
                return trtllm_serve_argv(
                    model_dir=dirs(pytorch_checkpoint), tokenizer_dir=None, backend="pytorch",
                    tp=target.tp, pp=target.pp, shape=target.shape, settings=pytorch_serve,
                )

            entry = self._entry(target, checkpoint, serve_args)
        else:
            vllm = recipe.serve.vllm or VllmServe()
            prequantized = target.quant == "nvfp4" or (
                target.quant == "fp8" and vllm.quantization == "checkpoint"
            )
            checkpoint = self.quantize(target, keys[0], "hf") if prequantized else keys[0]
            if checkpoint != keys[0]:
                keys.append(checkpoint)
            serve_args = vllm.model_dump()
            vllm_checkpoint, vllm_settings = checkpoint, vllm

            def smoke_argv(dirs: DirOf, _out: Path) -> list[str]:
                return vllm_argv(self.settings.vllm_python, VllmServing(
                    target.shape, vllm_settings, target.gpu.is_cpu, recipe.model.dtype,
                    target.quant, target.kv_cache_dtype, prequantized, target.tp, target.pp,
                ), model_dir=dirs(vllm_checkpoint), served_name=recipe.model.name)
            entry = self._entry(target, checkpoint, serve_args)
        keys.append(entry)
        smoke = recipe.smoke
        smoke_params = {
            "runtime": target.runtime, "prompts": smoke.prompts, "max_tokens": smoke.max_tokens,
            "concurrency": smoke.concurrency, "requests": smoke.requests,
            "reference": [r.model_dump() for r in smoke.reference],
            "reference_agreement": smoke.reference_agreement,
            # only when asked: a recipe without a curve keeps the keys it had
            **({"capacity": smoke.capacity.model_dump()} if smoke.capacity else {}),
        }
        keys.append(self.add(
            target, "smoke", kind=KIND_SMOKE, params=smoke_params, inputs=[entry],
            toolchain=on_gpu, toolchain_stage=f"smoke:{target.runtime}",
            argv=smoke_argv, gpu=target.gpu.sku, gpus=0 if target.gpu.is_cpu else ranks))
        if target.runtime == "trtllm" and recipe.build.strip_plan:  # refitted, then served
            smoke_run, built = self.stages[keys[-1]], self.stages[entry]
            smoke_run.before = [refit_argv(
                engine_dir=self.dir_of(entry), checkpoint_dir=self.dir_of(built.inputs[0]),
                output_dir=smoke_run.workdir / REFIT_DIR)]
        return keys

    def _entry(self, target: Target, checkpoint: str, serve_args: dict[str, Any]) -> str:
        """A no-build entry: the validated runtime configuration, stored as an artifact."""
        params = {
            "runtime": target.runtime, "tp": target.tp, "pp": target.pp, "quant": target.quant,
            "kv_cache_dtype": target.kv_cache_dtype,
            "shape": target.shape.model_dump(exclude={"name"}), "serve": serve_args,
        }
        return self.add(
            target, "build", kind=ENTRY_KINDS[target.runtime], params=params, inputs=[checkpoint],
            toolchain=self.toolchains.for_gpu(target.gpu.sku),
            toolchain_stage=f"build:{target.runtime}",
            argv=no_argv,
        )


def plan_recipe(
    loaded: LoadedRecipe, settings: Settings,
    toolchain: Toolchain | PoolToolchains | None = None, *,
    source: ModelSource | None = None,
) -> Plan:
    """Expand, check and key every target of *loaded*; raise PlanError on the first that
    cannot work. *toolchain* is one fingerprint for every target (a local build's), or one
    per GPU pool; the builder image's versions when None. The recipe's pins go on top.
    *source*: what the model source said (`model_source`, read here when None; a Ray task
    gets the driver's, so both key with the same commit)."""
    source = source or model_source(loaded)
    if not isinstance(toolchain, PoolToolchains):
        toolchain = PoolToolchains(toolchain or BUILDER_IMAGE)
    pools = toolchain.pinned(loaded.recipe.toolchain)
    planner = _Planner(loaded, source, settings, pools)
    planned = [PlannedTarget(target, fit, planner.chain(target))
               for target, fit in plan_targets(loaded, source.architecture)]
    promoted = channels(loaded, [(p.target, p.chain) for p in planned])
    return Plan(loaded, pools, planned, planner.stages, promoted, source=source)


def selected_keys(plan: Plan, only: str | None) -> set[str]:
    """The keys the targets matching *only* (a glob over target ids) need."""
    return keys_of(((t.target.id, t.chain) for t in plan.targets), only)
