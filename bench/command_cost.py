"""What each `enginectl` command costs before it does any work: its wall time on tiny
inputs, beside the start-up of the peers' commands (`s5cmd version`, `dvc --version`, `aws
--version`).

A registry of its own (SQLite, a `file://` store, a fetch cache, all in a temp dir) holds one
tiny artifact (two small files, imported `--ready`), fetched and pulled once so that its
blobs are cached. Then in interleaved rounds (median of --rounds) each command runs as a user
runs it, in a fresh process with its `.pyc` files (no PYTHONDONTWRITEBYTECODE), stdout read
and dropped:

  --help    `enginectl --help` (start-up alone, for reference)
  ls        `enginectl ls`
  show      `enginectl show DIGEST`
  resolve   `enginectl resolve --model bench --gpu cpu --allow-unproven`
  info      `enginectl info` (store and registry asked, runtimes looked for)
  import    `enginectl import DIR --kind vllm --model bench`: two new tiny files each round
  fetch     `enginectl fetch DIGEST -o NEW_DIR` (every blob from the cache)
  pull      `enginectl pull DIGEST -o NEW_DIR --executable PYTHON` (cached; the runtime named,
            so that looking for vLLM's Python, a program of its own, is not timed)
  plan      `enginectl plan recipes/llama70b-h100.yaml`

Target: every command under 0.3 s wall on the development machine. Which heavy modules stay
off these paths is checked by tests/unit/test_command_imports.py (by import, never by time).
A peer that cannot be found or installed (bench/_support.py, bench/setup.sh) is left out
with a note.

Run: `.venv/bin/python bench/command_cost.py [--rounds N] [--checkout DIR]` from the
repository root (≈1 minute at 9 rounds on a quiet machine; `--checkout DIR` adds our commands
run from the code in DIR, e.g. an export of an earlier commit: the numbers before a change;
`--quick`: one round, no peers, to check it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from _support import (
    ENGINECTL,
    ROOT,
    Sample,
    add_quick,
    aws_bin,
    dvc_bin,
    loadavg,
    log,
    machine,
    median,
    quick_mode,
    run_measured,
    s5cmd_bin,
    scratch,
)

TARGET_S = 0.3
ENTRY = ("import sys\nsys.path.insert(0, sys.argv.pop(1))\nsys.argv[0] = 'enginectl'\n"
         "from pipeline.cli import entry\nentry()\n")
"""The console script, with the code of another checkout first on the path."""
OURS = ("ls", "show", "resolve", "info", "import", "fetch", "pull", "plan")
RECIPE = ROOT / "recipes" / "llama70b-h100.yaml"


def tiny_dir(path: Path, tag: str) -> Path:
    """Two tiny files, unique to *tag*: what `import` takes for a checkpoint."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"bench": tag}))
    (path / "notes.txt").write_text(f"{tag}\n")
    return path


def environment(tmp: Path) -> dict[str, str]:
    """A user with a registry, store and cache of this run's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")
           and k != "PYTHONDONTWRITEBYTECODE"}  # an installed enginectl has its .pyc
    (tmp / "user").mkdir()
    env.update(HOME=str(tmp / "user"), ENGINECTL_HOME=str(tmp / "home"),
               ENGINECTL_CACHE_DIR=str(tmp / "cache"), HF_HUB_OFFLINE="1",
               # `info` probes vLLM's Python: this one (without vllm), not whatever
               # `python3` on PATH is (a pyenv shim is a shell script, and slow)
               ENGINECTL_VLLM_PYTHON=sys.executable)
    return env


def enginectl(env: dict[str, str], *args: str) -> str:
    return subprocess.run([ENGINECTL, "-q", *args], env=env, capture_output=True, text=True,
                          check=True).stdout


def cases(tmp: Path, env: dict[str, str], *, quick: bool,
          checkout: Path | None = None) -> dict[str, Callable[[int], Sample]]:
    """Each command as a function of the round (which names its fresh directories); with
    *checkout*, each of ours again as the code in that folder runs it (`NAME @checkout`)."""
    digest = json.loads(enginectl(env, "import", str(tiny_dir(tmp / "first", "first")),
                                  "--kind", "vllm", "--model", "bench", "--ready",
                                  "--json"))["digest"]
    pull = ["--executable", sys.executable]
    enginectl(env, "fetch", digest, "-o", str(tmp / "out" / "fetch-warm"))
    enginectl(env, "pull", digest, "-o", str(tmp / "out" / "pull-warm"), *pull)

    def ours(start: list[str], tag: str) -> dict[str, Callable[[int], Sample]]:
        def command(*args: str | Callable[[int], str]) -> Callable[[int], Sample]:
            return lambda i: run_measured(
                [*start, *(a(i) if callable(a) else a for a in args)], env)

        def fresh(kind: str) -> Callable[[int], str]:
            return lambda i: str(tmp / kind / f"{tag}{i}")

        def new_dir(i: int) -> str:
            return str(tiny_dir(tmp / "in" / f"{tag}{i}", f"{tag}{i}"))

        return {
            "--help": command("--help"),
            "ls": command("ls"),
            "show": command("show", digest),
            "resolve": command("resolve", "--model", "bench", "--gpu", "cpu",
                               "--allow-unproven"),
            "info": command("info"),
            "import": command("-q", "import", new_dir, "--kind", "vllm", "--model", "bench"),
            # fetched copies are kept: deleting one changes its cache entries' ctime, and
            # the next fetch would hash them again (bench/cache_hit.py)
            "fetch": command("-q", "fetch", digest, "-o", fresh("fetched")),
            "pull": command("-q", "pull", digest, "-o", fresh("pulled"), *pull),
            "plan": command("plan", str(RECIPE)),
        }

    found = ours([ENGINECTL], "")
    if checkout is not None:
        start = [sys.executable, "-c", ENTRY, str(checkout)]
        found |= {f"{name} @{checkout.name}": case
                  for name, case in ours(start, checkout.name).items() if name in OURS}
    peers = {"s5cmd version": (s5cmd_bin, "version"), "dvc --version": (dvc_bin, "--version"),
             "aws --version": (aws_bin, "--version")}
    for name, (find, flag) in peers.items():
        program = find()
        if program is None:
            if not quick:  # --quick measures no peer, and says so
                log(f"{name}: not found and could not be installed; left out")
            continue
        found[name] = lambda _i, argv=[str(program), flag]: run_measured(argv, env)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--checkout", type=Path,
                        help="also time our commands with the code of this checkout")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rounds = 1
    print(f"machine: {machine()}")
    with scratch("enginectl-command-cost-") as tmp:
        env = environment(tmp)
        measured = cases(tmp, env, quick=args.quick, checkout=args.checkout)
        samples: dict[str, list[tuple[Sample, str]]] = {name: [] for name in measured}
        for i in range(args.rounds):
            for name, case in measured.items():
                load = loadavg()
                samples[name].append((case(i), load))
            log(f"round {i + 1}/{args.rounds} (load {loadavg()})")
    print(f"\nmedian of {args.rounds} interleaved rounds, wall clock of the whole process; "
          f"load average at the end {loadavg()}\n")
    print(f"{'command':<24} {'median s':>8} {'CPU s':>6}  {'target':<8} runs (s) [1-min load]")
    for name, values in samples.items():
        wall = median([s.seconds for s, _ in values])
        cpu = median([s.cpu for s, _ in values])
        ours = name.split(" @")[0] in OURS
        verdict = ("meets" if wall < TARGET_S else "MISSES") if ours else ""
        shown = ", ".join(f"{s.seconds:.2f} [{load.split()[0]}]" for s, load in values)
        print(f"{name:<24} {wall:8.3f} {cpu:6.2f}  {verdict:<8} {shown}")


if __name__ == "__main__":
    main()
