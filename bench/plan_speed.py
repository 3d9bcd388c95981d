"""How long `enginectl plan` takes on a 200-target recipe, on the largest recipe it accepts,
and `enginectl --help`.

Targets: plan of 200 targets < 0.5 s wall, plan of anything accepted < 1 s wall, --help <
0.3 s wall (whole process, as a user runs it). Run: `.venv/bin/python bench/plan_speed.py`
from the repository root (`--quick`: each once, to check the script runs; the suite does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENGINECTL = str(Path(sys.executable).parent / "enginectl")


def seventy_b() -> dict[str, Any]:
    """recipes/llama70b-h100.yaml, its aliases one per tp (the matrices below add tp 4)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "recipes" / "llama70b-h100.yaml").read_text())
    for rule in data.get("promote", []):
        rule["alias"] = rule["alias"].replace("{gpu}", "{gpu}/tp{tp}")
    return data


def two_hundred_targets(directory: Path) -> Path:
    data = seventy_b()
    data["matrix"].update(
        gpu=["h100", "h200", "h100-nvl", "gh200", "b200"],
        tp=[8, 4],
        quant=["fp8", "int4_awq"],
        exclude=[{"runtime": "vllm", "quant": "int4_awq"}, {"gpu": "b200", "quant": "int4_awq"}],
    )
    data["matrix"]["shape"] += [
        {"name": f"s{i}", "max_batch_size": 8 * (i + 1), "max_input_len": 1024,
         "max_seq_len": 2048}
        for i in range(3)
    ]
    path = directory / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def at_the_caps(directory: Path) -> Path:
    """The heaviest recipe `plan` accepts: near MAX_TARGETS targets before exclude, 64
    exclude entries, 64 long prompts, and comments up to MAX_RECIPE_BYTES."""
    from pipeline.recipe.fields import MAX_FILTERS, MAX_RECIPE_BYTES, MAX_SMOKE_ITEMS

    data = seventy_b()
    data["matrix"].update(gpu=["h100", "h200", "h100-nvl", "gh200", "b200"], tp=[8, 4],
                          quant=["fp8", "int4_awq"])
    data["matrix"]["shape"] = data["matrix"]["shape"][:1] + [
        {"name": f"s{i}", "max_batch_size": 8 * (i + 1), "max_input_len": 1024,
         "max_seq_len": 2048} for i in range(7)]  # 5 x 2 x 2 x 8 shapes x 3 runtimes = 480
    excludes = [{"runtime": "vllm", "quant": "int4_awq"}, {"gpu": "b200", "quant": "int4_awq"}]
    for gpu, runtime, quant in [("h200", "trtllm", "fp8"), ("gh200", "trtllm", "fp8"),
                                ("h100-nvl", "vllm", "fp8"), ("h100", "vllm", "fp8"),
                                ("h200", "trtllm", "int4_awq"), ("gh200", "trtllm", "int4_awq"),
                                ("h100-nvl", "trtllm", "int4_awq"),
                                ("h100", "trtllm", "int4_awq"), ("b200", "vllm", "fp8")]:
        excludes += [{"gpu": gpu, "tp": 4, "quant": quant, "shape": f"s{i}", "runtime": runtime}
                     for i in range(7)]
    data["matrix"]["exclude"] = excludes[:MAX_FILTERS]
    data["smoke"]["prompts"] = [f"Prompt {i}: " + "tell me about GPUs. " * 20
                                for i in range(MAX_SMOKE_ITEMS)]
    text = yaml.safe_dump(data, sort_keys=False)
    line = "# " + "padding " * 12 + "\n"
    text += line * ((MAX_RECIPE_BYTES - len(text) - 200) // len(line))
    path = directory / "caps.yaml"
    path.write_text(text)
    return path


def wall(argv: list[str], runs: int = 15) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times)


def main() -> None:
    from _support import add_quick, quick_mode

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    quick = quick_mode(parser.parse_args().quick)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ENGINECTL_HOME"] = str(Path(tmp) / "home")  # no registry: the user's aside
        recipe = two_hundred_targets(Path(tmp))
        plan = subprocess.run(
            [ENGINECTL, "plan", str(recipe), "--json"], check=True, capture_output=True, text=True
        )
        count = len(json.loads(plan.stdout)["targets"])
        caps = at_the_caps(Path(tmp))
        at_caps = subprocess.run(
            [ENGINECTL, "-q", "plan", str(caps), "--json"], check=True, capture_output=True,
            text=True,
        )
        caps_count = len(json.loads(at_caps.stdout)["targets"])
        size = caps.stat().st_size // 1024
        cases = [
            (f"plan --json, {count} targets", [ENGINECTL, "plan", str(recipe), "--json"]),
            (f"plan (table), {count} targets", [ENGINECTL, "plan", str(recipe)]),
            (f"plan --json, caps: {size} KiB, {caps_count} targets",
             [ENGINECTL, "-q", "plan", str(caps), "--json"]),
            ("--help", [ENGINECTL, "--help"]),
        ]
        for label, argv in cases[-1:] if quick else cases:  # quick: both plans ran above
            median, worst = wall(argv, 1 if quick else 15)
            print(f"{label:<32} median {median:.3f} s   max {worst:.3f} s")


if __name__ == "__main__":
    main()
