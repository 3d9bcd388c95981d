"""How long a refetch takes when everything is in the fetch cache: by full digest (the cached
manifest, no store request) and by alias (the registry asked, then the cache), on `file://`
and on S3, and on S3 with the server stopped.

Publishes FILES files of MIB MiB each (random bytes) into a `file://` store and into a
bucket of a local S3 server (s3rver, else moto; bench/_support.py), SQLite registry beside
each, fetches each once to fill its cache, then in interleaved rounds (median of ROUNDS)
times `enginectl fetch REF -o NEW_DIR` as a user runs it. A cache hit places hard links, so
the artifact's size hardly matters; its file count does. Fetched copies are kept until the
end: deleting one changes the ctime of the cache entries it shares, and the next fetch
re-hashes those (as it must: an edit in place changes the ctime the same way).

Target: < 0.2 s by full digest on S3 as on `file://`.
Run: `.venv/bin/python bench/cache_hit.py [--rounds N] [--files N --mib M]` from the
repository root (≈1 minute; `--quick`: one round of 2 × 1 MiB on moto, to check it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from _support import (
    ENGINECTL,
    MiB,
    Sample,
    add_quick,
    loadavg,
    log,
    machine,
    make_artifact,
    median,
    quick_mode,
    run_measured,
    s3_server,
    scratch,
)

TARGET_S = 0.2


def enginectl(env: dict[str, str], *args: str) -> dict[str, object]:
    done = subprocess.run([ENGINECTL, "-q", *args, "--json"], env=env, capture_output=True,
                          text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def setup(tmp: Path, name: str, source: Path, store_url: str,
          extra: dict[str, str]) -> tuple[dict[str, str], str]:
    """An environment for a store at *store_url* with its own home and cache, *source*
    imported and tagged `bench/hit`, and fetched once (beside the home: a fetch into
    enginectl's home is refused); (environment, digest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")
           and k != "PYTHONDONTWRITEBYTECODE"}  # an installed enginectl has its .pyc
    env.update(extra, ENGINECTL_HOME=str(tmp / name / "home"), ENGINECTL_STORE_URL=store_url,
               ENGINECTL_CACHE_DIR=str(tmp / name / "cache"))
    digest = str(enginectl(env, "import", str(source), "--kind", "vllm", "--model", "bench",
                           "--ready")["digest"])
    subprocess.run([ENGINECTL, "-q", "tag", digest, "bench/hit"], env=env, check=True,
                   capture_output=True)
    enginectl(env, "fetch", digest, "-o", str(tmp / name / "first"))
    return env, digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=16, help="size of each file")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rounds, args.files, args.mib = 1, 2, 1
    print(f"machine: {machine()}")
    with scratch("enginectl-cache-hit-") as tmp:
        source = make_artifact(tmp / "src", files=args.files, size=args.mib * MiB)
        (source / "config.json").write_text("{}")  # what import takes for a checkpoint
        file_env, file_digest = setup(tmp, "file", source, (tmp / "store").as_uri(), {})
        with s3_server(tmp) as server:
            bucket = server.create_bucket()
            s3_env, s3_digest = setup(tmp, "s3", source, f"s3://{bucket}/bench",
                                      {**server.env,
                                       "ENGINECTL_S3_ENDPOINT_URL": server.endpoint_url})
            print(f"{args.files} files × {args.mib} MiB; S3 server: {server.kind}")

            def fetch(env: dict[str, str], ref: str) -> Callable[[Path], Sample]:
                return lambda dest: run_measured([ENGINECTL, "-q", "fetch", ref, "-o",
                                                  str(dest)], env)

            cases: dict[str, Callable[[Path], Sample]] = {
                "file://, by digest": fetch(file_env, file_digest),
                "file://, by alias": fetch(file_env, "bench/hit"),
                "S3, by digest": fetch(s3_env, s3_digest),
                "S3, by alias": fetch(s3_env, "bench/hit"),
            }
            samples: dict[str, list[tuple[Sample, str]]] = {name: [] for name in cases}
            samples["S3 server stopped, by digest"] = []

            def rounds(names: list[str]) -> None:
                for i in range(args.rounds):
                    for name in names:
                        dest = tmp / "out" / f"{list(samples).index(name)}-{i}"
                        load = loadavg()
                        samples[name].append((cases[name](dest), load))
                        # kept: deleting a fetched copy changes its cache entries' ctime,
                        # and the next fetch would re-hash them (registry/store/cache.py)
                    log(f"round {i + 1}/{args.rounds} (load {loadavg()})")

            rounds(list(cases))
        # the server is stopped now: a fetch by digest still works from the cache alone
        cases["S3 server stopped, by digest"] = fetch(s3_env, s3_digest)
        rounds(["S3 server stopped, by digest"])

    print(f"\nmedian of {args.rounds} rounds, wall clock of the whole command; load average at "
          f"the end {loadavg()}\n")
    print(f"{'case':<32} {'median s':>8} {'CPU s':>6}  runs (s) [load at start]")
    for name, values in samples.items():
        wall = median([s.seconds for s, _ in values])
        cpu = median([s.cpu for s, _ in values])
        shown = ", ".join(f"{s.seconds:.2f} [{load.split()[0]}]" for s, load in values)
        print(f"{name:<32} {wall:8.3f} {cpu:6.2f}  {shown}")
    for name in ("file://, by digest", "S3, by digest"):
        wall = median([s.seconds for s, _ in samples[name]])
        print(f"{name}: {wall:.3f} s, {'meets' if wall < TARGET_S else 'MISSES'} the "
              f"< {TARGET_S} s target")


if __name__ == "__main__":
    main()
