"""Weight-stripped engines: store bytes and pull bytes, whole against stripped.

For the tiny Llama (scripts/make_tiny_model.py), quantized to FP8 for real (modelopt, the
TensorRT-LLM checkpoint export) and built into two engine shapes by TensorRT-LLM's stand-ins
(tests/fakes: a whole engine carries its rank's weight bytes, as a real one is about the size
of its weights; a stripped plan only their names), twice: `build: {strip_plan: false}` and
`{strip_plan: true}`, each into a store of its own. Measured per side: the store's bytes (its
blobs), the engines' bytes, and on a fresh node (its own fetch cache) the bytes the first
shape's `pull` downloads, then the second shape's on the same node. Then the 70B recipe
(recipes/llama70b-h100.yaml) on paper: its matrix's store bytes whole and stripped as `plan`
estimates them (the memory fit's weights per engine and checkpoint, a stripped plan the share
NVIDIA published for llama2-70b FP8 tp2: 60.61 MB of 64.78 GB; llama-7b INT4-AWQ: 5.3 MB of
3.7 GB), and the pulls likewise. Goals: the matrix's store bytes ÷ 5 or better, a second
shape's pull < 1% of a whole engine's bytes.

    .venv/bin/python bench/strip_bytes.py

`--quick`: a toy model converted by the stand-ins (bf16, no modelopt); numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _support import ROOT, add_quick, log, machine, quick_mode, scratch

SHAPES = [{"name": "chat", "max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
          {"name": "wide", "max_batch_size": 16, "max_input_len": 128, "max_seq_len": 256}]
SMOKE = {"prompts": ["The capital of France is"], "max_tokens": 4, "concurrency": [1],
         "requests": 2, "ready_timeout_s": 300}
PUBLISHED = {"llama2-70b fp8 tp2": (64.78e9, 60.61e6), "llama-7b int4-awq": (3.7e9, 5.3e6)}


def cli(env: dict[str, str], *args: str | Path) -> str:
    done = subprocess.run([str(Path(sys.executable).parent / "enginectl"), *map(str, args)],
                          env=env, text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"enginectl {' '.join(map(str, args))} exited {done.returncode}: "
                         f"{done.stderr.strip()[-2000:]}")
    return done.stdout


def side(work: Path, *, strip: bool, quick: bool) -> dict[str, Any]:
    """Build the two shapes (whole or stripped) into a store of their own; measure."""
    from tests.helpers import builder_env, fake_gpu

    home = work / ("stripped" if strip else "whole")
    env = {**builder_env(home, f"sqlite:///{home / 'registry.db'}"), **fake_gpu(home / "gpu"),
           "ENGINECTL_CACHE_DIR": str(home / "builder-cache"), "ENGINECTL_PYTHON": sys.executable,
           # the stand-in server's speed set by itself, not by this shared machine's load,
           # so that the refit-equivalence A/B compares like with like
           "FAKE_OPENAI_TOKEN_DELAY_S": "0.01"}
    recipe: dict[str, Any] = {
        "model": {"name": "tiny", "source": str(work / "model"), "dtype": "bfloat16"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16" if quick else "fp8"], "shape": SHAPES},
        "build": {"strip_plan": strip}, "serve": {"trtllm": {}}, "smoke": SMOKE,
        "nightly": {"gate_rounds": 1},
    }
    if not quick:
        recipe["quantize"] = {"calibration": {
            "file": str(ROOT / "recipes" / "calibration" / "tiny.jsonl"),
            "digest": "sha256:ea0b824c6c8ec24032650dc017cf54f96e261291c4312014c3e877adc3a8ec7c",
            "samples": 16, "seq_len": 64}}
    path = home / "recipe.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe))
    log(f"building {'stripped' if strip else 'whole'} engines")
    cli(env, "build", path)
    listed = json.loads(cli(env, "ls", "--json"))
    engines = sorted((a for a in listed if a["kind"] == "trtllm-engine"),
                     key=lambda a: a["max_batch_size"])
    checkpoints = [a for a in listed if a["kind"] in ("quantized-checkpoint",
                                                      "converted-checkpoint")]
    blobs = home / "home" / "store" / "blobs"
    store = sum(p.stat().st_size for p in blobs.rglob("*") if p.is_file())
    node = {**env, "ENGINECTL_CACHE_DIR": str(home / "node-cache")}
    pulls = [json.loads(cli(node, "pull", engine["digest"], "-o", home / f"pull-{n}",
                            "--json")) for n, engine in enumerate(engines)]
    return {"strip_plan": strip, "statuses": [e["status"] for e in engines],
            "store_bytes": store, "engine_bytes": sum(e["size"] for e in engines),
            "checkpoint_bytes": sum(c["size"] for c in checkpoints),
            "first_pull_bytes": pulls[0]["downloaded_bytes"],
            "second_shape_pull_bytes": pulls[1]["downloaded_bytes"],
            "refit_s": [p["refit"]["seconds"] if p.get("refit") else None for p in pulls]}


def on_paper() -> dict[str, Any]:
    """recipes/llama70b-h100.yaml as `plan` estimates it, and the pulls likewise."""
    from pipeline.executors.preview import store_bytes
    from pipeline.planning.plan import KIND_ENGINE, plan_recipe
    from pipeline.planning.source import read_recipe
    from pipeline.settings import Settings
    from pipeline.stages.refit import PLAN_FRACTION

    plan = plan_recipe(read_recipe(ROOT / "recipes" / "llama70b-h100.yaml"),
                       Settings.from_env())
    found = store_bytes(plan)
    chat = next(t for t in plan.targets if t.target.runtime == "trtllm"
                and t.target.quant == "fp8" and t.target.shape.name == "chat")
    engine = chat.fit.weights_bytes * chat.target.tp * chat.target.pp
    del KIND_ENGINE
    return {**found, "ratio": round(found["whole_bytes"] / found["stripped_bytes"], 2),
            "engines_only_ratio": round((found["whole_bytes"] - found["checkpoint_bytes"])
                                        / max(found["plan_bytes"], 1)),
            "fp8_tp8_engine_bytes": engine,
            "first_pull_bytes": {"whole": engine, "stripped": round(engine * PLAN_FRACTION)
                                 + engine},
            "second_shape_pull_bytes": {"whole": engine,
                                        "stripped": round(engine * PLAN_FRACTION)},
            "published_plan_share": {name: f"{stripped / whole:.3%}"
                                     for name, (whole, stripped) in PUBLISHED.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick(parser)
    quick = quick_mode(parser.parse_args().quick)
    sys.path.insert(0, str(ROOT))
    with scratch("strip-bytes") as work:
        if quick:
            from tests.integration.builds import make_model

            make_model(work / "model")
        else:
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"),
                            str(work / "model")], check=True, capture_output=True,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
        whole, stripped = side(work, strip=False, quick=quick), side(work, strip=True,
                                                                      quick=quick)
        tiny = {"whole": whole, "stripped": stripped,
                "store_ratio": round(whole["store_bytes"] / stripped["store_bytes"], 2),
                "engines_ratio": round(whole["engine_bytes"] / stripped["engine_bytes"], 1),
                "second_shape_pull_share_of_whole_engine": round(
                    stripped["second_shape_pull_bytes"] / (whole["engine_bytes"] / 2), 4)}
        print(json.dumps({"machine": machine(), "tiny": tiny, "llama70b_h100": on_paper()},
                         indent=2))


if __name__ == "__main__":
    main()
