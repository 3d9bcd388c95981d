"""What `enginectl build` itself costs: per-stage orchestration overhead, and a fully cached
build of the 70B recipe.

Targets: orchestration overhead per stage under 50 ms beyond the tool's own time; a fully
cached `build` of recipes/llama70b-h100.yaml (every key a hit) under 1 s wall.

1. A recipe of 12 engines (3 shapes x 2 tp x 2 quant-free dtypes) on the file store and
   SQLite, built with tests/fakes' stand-ins for convert_checkpoint.py and trtllm-build, which
   do (almost) nothing. Overhead per stage = (sum of the stages' wall time reported by the
   executor - the tools' own time, measured by running the same argv lists directly) / stages.
2. Every key of the 70B plan (as this machine keys it) registered as an artifact, then
   `enginectl build recipes/llama70b-h100.yaml` timed as a user runs it.

Run: `.venv/bin/python bench/build_speed.py` from the repository root.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENGINECTL = str(Path(sys.executable).parent / "enginectl")
FAKES = ROOT / "tests" / "fakes"


def overhead(tmp: Path) -> None:
    from tests.integration.test_build import make_model

    make_model(tmp / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "tp": [1, 2], "quant": ["bf16", "fp16"], "shape": [
            {"name": f"s{i}", "max_batch_size": 4 * (i + 1), "max_input_len": 256,
             "max_seq_len": 512} for i in range(3)]},
        "serve": {"trtllm": {}},
    }
    path = tmp / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "ENGINECTL_HOME": str(tmp / "home"),
           "ENGINECTL_TRTLLM_EXAMPLES": str(FAKES / "examples"),
           "ENGINECTL_PYTHON": sys.executable}
    started = time.perf_counter()
    done = subprocess.run([ENGINECTL, "build", str(path), "--json", "--jobs", "1"], env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    summary = json.loads(done.stdout)
    stages = [s for s in summary["stages"] if s["status"] == "built"]
    stage_time = sum(s["seconds"] for s in stages)
    # the tools' own time: the same argv lists, run directly
    plan = json.loads(subprocess.run([ENGINECTL, "build", str(path), "--dry-run", "--json"],
                                     env=env, capture_output=True, text=True, check=True).stdout)
    tool_time = 0.0
    scratch = tmp / "direct"
    for stage in plan["stages"]:
        if stage["stage"] in ("convert", "build") and stage["argv"]:
            argv = [a.replace(str(tmp / "home" / "work"), str(scratch)) for a in stage["argv"]]
            for i, arg in enumerate(argv):
                if arg == "--checkpoint_dir":
                    argv[i + 1] = str(scratch / "ckpt")
                if arg == "--output_dir":
                    argv[i + 1] = str(scratch / ("ckpt" if stage["stage"] == "convert" else "eng"))
                if arg == "--model_dir":
                    argv[i + 1] = str(tmp / "model")
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True, capture_output=True)
            tool_time += time.perf_counter() - t0
    tool_stages = sum(1 for s in stages if s["stage"] in ("convert", "build"))
    print(f"built {len(stages)} stage runs ({tool_stages} with a tool) in {wall:.2f} s wall")
    print(f"  stage time {stage_time:.2f} s, tools alone {tool_time:.2f} s")
    print(f"  orchestration per stage: {(stage_time - tool_time) / len(stages) * 1000:.0f} ms "
          "(lease, validation, hashing, publish, release; target < 50 ms)")


def cached_build(tmp: Path) -> None:
    from pipeline.plan import plan_recipe
    from pipeline.recipe import load_recipe
    from pipeline.settings import Settings
    from pipeline.toolchain import for_build, probe
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.records import ArtifactRecord, add_artifact_if_absent

    env = {**os.environ, "ENGINECTL_HOME": str(tmp / "home70b")}
    os.environ.update(env)
    loaded = load_recipe(ROOT / "recipes" / "llama70b-h100.yaml")
    settings = Settings.from_env()
    plan = plan_recipe(loaded, settings, for_build(probe(settings.python).toolchain,
                                                   loaded.recipe.toolchain))
    ctx = Context(RegistryConfig.from_env())
    with ctx.registry.session() as session:
        for n, run in enumerate(plan.stages.values()):
            if run.stage == "smoke":
                continue
            kind = "hf-checkpoint" if run.kind == "smoke-report" else run.kind
            add_artifact_if_absent(session, ArtifactRecord(
                digest=f"sha256:{n:064x}", kind=kind, model="llama-3.3-70b-instruct",  # type: ignore[arg-type]
                size=0, file_count=0, status="built", key=run.key))
    ctx.close()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        done = subprocess.run([ENGINECTL, "build", str(ROOT / "recipes" / "llama70b-h100.yaml"),
                               "--json"], env=env, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
    summary = json.loads(done.stdout)
    print(f"fully cached build of llama70b-h100: {summary['reused']} reused, "
          f"{summary['built']} built; median {statistics.median(times):.3f} s, "
          f"max {max(times):.3f} s wall (target < 1 s)")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        overhead(Path(tmp))
        cached_build(Path(tmp))


if __name__ == "__main__":
    main()
