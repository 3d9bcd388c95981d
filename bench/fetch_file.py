"""How fast `enginectl fetch` copies a 2 GiB artifact out of a `file://` store, against `cp -r`.

Publishes 8 files × 256 MiB of random bytes into a `file://` store in a temp dir (SQLite
registry beside it), then in interleaved rounds (median of ROUNDS), wall clock, with the
store's blobs in the page cache before every run and `sync` before every run (so one run's
dirty pages are not the next run's cost):

  (a)  `enginectl fetch DIGEST -o DIR`, fetch cache emptied first: every blob is copied
       into the cache (copy_file_range: a kernel copy, a reflink where the file system has
       them) and its xxh3-128 checked on the copy through mmap, then hard-linked into DIR
       (whole process)
  (a') the same through `registry.ops.fetch.fetch` in this process (no start-up cost)
  (b)  `cp -r STORE/blobs DIR` (the same 8 files, into a fresh dir; no verification)
  (e)  a second `enginectl fetch` into a new dir: every blob is in the cache (re-hash + link)

Target: (a) at least 1.0× the speed of (b), verification included; (e) < 0.2 s.
`--checkout DIR` adds (a) run from the code in DIR (e.g. the main checkout: the number
before a change, in the same rounds).
Run: `.venv/bin/python bench/fetch_file.py [--rounds N] [--files N --file-mib M]
[--checkout DIR]` from the repository root
(≈2 minutes; about 6 GiB of temp disk, removed at the end).
`--quick`: one round of 2 × 1 MiB, to check the script runs (the suite does).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from _support import (
    ENGINECTL,
    GiB,
    MiB,
    Sample,
    add_quick,
    content_bytes,
    loadavg,
    log,
    machine,
    make_artifact,
    measure_in_process,
    median,
    quick_mode,
    read_all,
    rmtree,
    run_measured,
    scratch,
    timed,
)

TARGET = 1.0
HIT_TARGET_S = 0.2


def main() -> None:  # noqa: PLR0915 - one linear script reads best
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=8, help="files in the artifact")
    parser.add_argument("--file-mib", type=int, default=256, help="size of each file")
    parser.add_argument("--checkout", type=Path, help="also run (a) with this checkout's code")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rounds, args.files, args.file_mib = 1, 2, 1

    print(f"machine: {machine()}")
    with scratch("enginectl-fetch-file-") as tmp:
        home = tmp / "home"
        store = tmp / "store"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")
               and k != "PYTHONDONTWRITEBYTECODE"}  # an installed enginectl has its .pyc
        env.update(
            ENGINECTL_HOME=str(home),
            ENGINECTL_STORE_URL=store.as_uri(),
            ENGINECTL_REGISTRY_URL=f"sqlite:///{home / 'registry.db'}",
            ENGINECTL_CACHE_DIR=str(tmp / "cache"),
        )
        os.environ.update(env)

        from registry.config import RegistryConfig
        from registry.context import Context
        from registry.ops.fetch import fetch
        from registry.ops.publish import publish

        log(f"writing {args.files} × {args.file_mib} MiB …")
        source = make_artifact(tmp / "src", files=args.files, size=args.file_mib * MiB)
        ctx = Context(RegistryConfig.from_env())
        published = []
        publish_s = timed(lambda: published.append(
            publish(ctx, source, kind="vllm", labels={"model": "bench"}, status="ready")))
        digest, size = published[0].digest, published[0].manifest.size
        ctx.close()
        print(f"published {digest} ({size / GiB:.2f} GiB) into {store.as_uri()} in "
              f"{publish_s:.1f} s (hash + copy + fsync)")
        rmtree(source)
        blobs = sorted(p for p in (store / "blobs").rglob("*") if p.is_file())

        def in_process(dest: Path) -> Sample:
            context = Context(RegistryConfig.from_env())
            try:
                return measure_in_process(lambda: fetch(context, digest, dest))
            finally:
                context.close()

        cli = [ENGINECTL, "fetch", digest, "-o"]
        cases: list[tuple[str, str, Callable[[Path], Sample]]] = [
            ("(a) enginectl fetch, cold cache", "a",
             lambda dest: run_measured([*cli, str(dest)], env)),
            ("(a') fetch() in process, cold cache", "a2", in_process),
            ("(b) cp -r", "b",
             lambda dest: run_measured(["cp", "-r", str(store / "blobs"), str(dest)])),
        ]
        if args.checkout is not None:
            entry = ("import sys\nsys.path.insert(0, sys.argv.pop(1))\n"
                     "sys.argv[0] = 'enginectl'\nfrom pipeline.cli import entry\nentry()\n")
            before = [sys.executable, "-c", entry, str(args.checkout.resolve()), "fetch", digest,
                      "-o"]
            cases.append((f"(a) at {args.checkout}", "c",
                          lambda dest: run_measured([*before, str(dest)], env)))
        hit = "(e) enginectl fetch, cache hit"
        samples: dict[str, list[Sample]] = {name: [] for name, _, _ in cases}
        samples[hit] = []
        for i in range(args.rounds):
            for name, label, case in cases:
                log(f"round {i + 1}/{args.rounds}: {name} (load {loadavg()})")
                dest = tmp / f"out-{label}-{i}"
                rmtree(tmp / "cache")
                read_all(blobs)
                os.sync()
                samples[name].append(case(dest))
                if (got := content_bytes(dest)) != size:
                    sys.exit(f"{name} produced {got} bytes, expected {size}")
                if label == "a":
                    again = tmp / f"out-e-{i}"
                    os.sync()
                    samples[hit].append(run_measured([*cli, str(again)], env))
                    rmtree(again)
                rmtree(dest)

        cp = median([x.seconds for x in samples["(b) cp -r"]])
        print(f"\n{size / GiB:.2f} GiB = {size} bytes in {args.files} files, from page cache; "
              f"median of {args.rounds} rounds; speed vs cp = time of (b) / time; "
              f"load average at the end {loadavg()}\n")
        print(f"{'case':<38} {'median s':>8} {'MB/s':>6} {'vs cp':>6} {'CPU s':>6} "
              f"{'peak RSS':>9}  runs (s)")
        for name, values in samples.items():
            wall = median([x.seconds for x in values])
            rss = [x.rss_mib for x in values if x.rss_mib is not None]
            shown = f"{max(rss):.0f} MiB" if rss else "-"
            print(f"{name:<38} {wall:8.2f} {size / wall / 1e6:6.0f} {cp / wall:6.2f} "
                  f"{median([x.cpu for x in values]):6.2f} {shown:>9}  "
                  f"{', '.join(f'{x.seconds:.2f}' for x in values)}")
        cold = median([x.seconds for x in samples["(a) enginectl fetch, cold cache"]])
        warm = median([x.seconds for x in samples[hit]])
        print(f"\n(a) runs at {cp / cold:.2f}× cp's speed: "
              f"{'meets' if cp / cold >= TARGET else 'MISSES'} the ≥ {TARGET}× target")
        print(f"(e) cache hit {warm:.2f} s: {'meets' if warm < HIT_TARGET_S else 'MISSES'} the "
              f"< {HIT_TARGET_S} s target")


if __name__ == "__main__":
    main()
