"""The Ray executor is optional: the local paths (help, plan, a local build, fetch) never
import Ray, checked in fresh interpreters that run the CLI's entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.ray.fleet import FAKES, fleet_recipe

SCRIPT = """\
import atexit, sys
def report():
    loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
    print("RAY-MODULES " + ",".join(loaded), file=sys.stderr)
atexit.register(report)
sys.argv = ["enginectl", *sys.argv[1:]]
from pipeline.cli import entry
entry()
"""


def run(env: dict[str, str], *args: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr)
    marker = [line for line in done.stderr.splitlines() if line.startswith("RAY-MODULES")]
    assert marker == ["RAY-MODULES "], (args, marker)
    return done.stdout, done.stderr


def test_help_plan_a_local_build_and_fetch_never_import_ray(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINECTL_", "RAY_"))}
    env |= {"ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
            "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "ENGINECTL_VLLM_PYTHON": str(tmp_path / "no-vllm")}
    recipe = fleet_recipe(tmp_path, gpu=["cpu"], tp=[1], include=[], exclude=[],
                          serve={"vllm": {}})
    run(env, "--help")
    run(env, "build", "--help")
    run(env, "fleet", "--help")
    run(env, "plan", str(recipe))
    out, _ = run(env, "build", str(recipe), "--json")
    summary = json.loads(out)
    assert summary["built"] == 2  # the snapshot and the vLLM entry, on this machine
    entry = next(s["digest"] for s in summary["stages"] if s["stage"] == "build")
    run(env, "fetch", entry, "-o", str(tmp_path / "fetched"))
    assert (tmp_path / "fetched" / "enginectl-entry.json").is_file()
