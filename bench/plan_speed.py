"""How long `enginectl plan` takes on a 200-target recipe, and `enginectl --help`.

Targets: plan of 200 targets < 0.5 s wall, --help < 0.3 s wall (whole process, as a user
runs it). Run: `.venv/bin/python bench/plan_speed.py` from the repository root.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENGINECTL = str(Path(sys.executable).parent / "enginectl")


def two_hundred_targets(directory: Path) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / "llama70b-h100.yaml").read_text())
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


def wall(argv: list[str], runs: int = 15) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        recipe = two_hundred_targets(Path(tmp))
        plan = subprocess.run(
            [ENGINECTL, "plan", str(recipe), "--json"], check=True, capture_output=True, text=True
        )
        count = len(yaml.safe_load(plan.stdout)["targets"])
        for label, argv in [
            (f"plan --json, {count} targets", [ENGINECTL, "plan", str(recipe), "--json"]),
            (f"plan (table), {count} targets", [ENGINECTL, "plan", str(recipe)]),
            ("--help", [ENGINECTL, "--help"]),
        ]:
            median, worst = wall(argv)
            print(f"{label:<32} median {median:.3f} s   max {worst:.3f} s")


if __name__ == "__main__":
    main()
