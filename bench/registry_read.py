"""Fetch's read of the registry two ways: on the database driver alone (`registry.sql.lookup`,
what `fetch` and `pull REF` run) and through SQLAlchemy's ORM (`open_registry` + `resolve_ref`
+ the status, what every other read runs), on the registry `resolve_scale.py` seeds (100,000
artifacts by default), SQLite and PostgreSQL.

Two measures, each road interleaved with the other round by round:

- `process`: a fresh Python that imports the road and answers one ref (a 12-digit digest
  prefix), wall time: what one `enginectl fetch` pays for its read;
- `call`: the same answer in this process, imports done, connection opened each time as a
  fetch opens it: what the read itself costs.

Decides whether the driver-only reader is worth keeping beside the ORM: its gain is the
import, so `process` is the measure that counts.
Run: `.venv/bin/python bench/registry_read.py [--rows N] [--rounds N] [--sqlite-only]`
(≈2 minutes; `--quick`: 300 rows, 2 rounds, to check the script runs).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from collections.abc import Callable

from _support import ROOT, add_quick, loadavg, log, machine, median, quick_mode, scratch
from resolve_scale import postgres_answers, postgres_schema, seed

ROADS = {
    "driver (lookup)": (
        "from registry.sql.lookup import lookup\n"
        "found = lookup(URL, REF)\n"
        "answer = (found.digest, found.status)\n"),
    "ORM (open_registry)": (
        "from registry.sql.db import open_registry\n"
        "from registry.sql.records import get_status\n"
        "from registry.sql.refs import resolve_ref\n"
        "with open_registry(URL, readonly=True) as registry, "
        "registry.session(readonly=True) as session:\n"
        "    digest = resolve_ref(session, REF)\n"
        "    answer = (digest, get_status(session, digest))\n"),
}


def in_process(code: str, url: str, ref: str) -> Callable[[], object]:
    def call() -> object:
        scope = {"URL": url, "REF": ref}
        exec(code, scope)  # noqa: S102 - this file's own two snippets
        return scope["answer"]
    return call


def fresh_process(code: str, url: str, ref: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"URL = {url!r}\nREF = {ref!r}\n{code}"],
                   cwd=ROOT, check=True, env={"PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def bench(name: str, url: str, args: argparse.Namespace) -> None:
    artifacts, _, seconds = seed(url, args.rows, args.models, random.Random(1))  # noqa: S311
    from registry.sql.lookup import open_reader

    with open_reader(url) as reader:
        digest = str(reader.rows("SELECT digest FROM artifacts ORDER BY id LIMIT 1")[0][0])
    ref = digest[7:19]
    answers = {road: in_process(code, url, ref)() for road, code in ROADS.items()}
    assert len(set(answers.values())) == 1, answers
    print(f"\n{name}: {artifacts} artifacts seeded in {seconds:.1f} s; ref {ref} "
          f"(load {loadavg()})")
    process: dict[str, list[float]] = {road: [] for road in ROADS}
    call: dict[str, list[float]] = {road: [] for road in ROADS}
    for _ in range(args.rounds):
        for road, code in ROADS.items():
            process[road].append(fresh_process(code, url, ref))
            action = in_process(code, url, ref)
            start = time.perf_counter()
            for _ in range(20):
                action()
            call[road].append((time.perf_counter() - start) / 20)
    for road in ROADS:
        print(f"  {road:<22} process {median(process[road]) * 1000:7.1f} ms  "
              f"call {median(call[road]) * 1000:6.2f} ms   "
              f"(process: {', '.join(f'{v * 1000:.0f}' for v in process[road])})")
    driver, orm = (median(process[road]) for road in ROADS)
    print(f"  a fresh process's read: the driver takes {driver / orm:.2f}x the ORM's time "
          f"(load {loadavg()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sqlite-only", action="store_true")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rows, args.models, args.rounds = 300, 3, 2
    print(f"machine: {machine()}")
    with scratch("enginectl-read-") as tmp:
        bench("SQLite", f"sqlite:///{tmp / 'registry.db'}", args)
        if not args.sqlite_only and not (args.quick and not postgres_answers()):
            log("PostgreSQL …")
            with postgres_schema() as url:
                bench("PostgreSQL", url, args)


if __name__ == "__main__":
    main()
