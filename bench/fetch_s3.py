"""How fast `enginectl fetch` pulls a 2 GiB artifact from S3, against the usual tools.

Starts s3rver (npm, installed under ~/.cache/enginectl-bench on first use; moto when s3rver
cannot be had, which the output says) on 127.0.0.1, creates a bucket, and publishes an
artifact of 8 files × 256 MiB of random bytes with `registry.ops.publish.publish` (SQLite
registry in a temp dir). Then, in interleaved rounds (median of ROUNDS), wall clock:

  (a)  `enginectl fetch DIGEST -o DIR`, fetch cache emptied first (downloads + xxh3
       verification while streaming), as a user runs it (whole process)
  (a') the same through `registry.ops.fetch.fetch` in this process (no start-up cost)
  (a0) (a) with ENGINECTL_S3_SPLICE=0: the bodies through obstore, not spliced by the
       kernel (`registry.store.s3splice`), to see what that path is worth in the same run
  (b)  `aws s3 cp --recursive` of the 8 blob objects (awscli v1)
  (c)  boto3 `download_file` with default TransferConfig, the 8 objects one after another
  (c') the same, 8 threads (one object each)
  (d)  `s5cmd cp 's3://bucket/prefix/blobs/*' DIR/`
  (e)  a second `enginectl fetch` into a new dir: every blob is in the cache (a hard link each)
  (f)  the server's own ceiling: 8 `curl -o /dev/null` of presigned URLs at once, one per
       object (no client work beyond the socket reads, nothing written)

with, for each, the client's CPU seconds (user + system), the server's CPU seconds, and the
peak RSS of the processes started (enginectl, aws, s5cmd). CPU seconds are the steadier
number on a shared 2-core machine: the client and the server compete for the same cores.
Outputs are removed after every run. Each round starts one case later than the round before
(a rotation), so that over as many rounds as cases each case runs once in every position:
the server's leftover work from whatever ran just before is not always charged to the same
case.

Targets: (a) at least as fast as (d) s5cmd, at no more than 1.1 × s5cmd's client CPU per
GiB, with a peak RSS under 64 MiB; at least 0.8 × the speed of (f); (a) not slower than (b)
or (c); (e) < 1 s.
Run: `.venv/bin/python bench/fetch_s3.py [--rounds N] [--moto] [--files N --file-mib M]
[--cases a,d,e,f]` from the repository root (`--files 2 --file-mib 640` checks blobs bigger
than 512 MiB, which need more than 2 × download_threads ranged reads; `--cases` measures only
the cases with those letters, `a2` for (a'), `a0`, `c2` for (c'), so that more rounds of the
ones compared fit in a quiet moment; `--quick`: one round of 2 × 1 MiB on moto, to check the
script runs)
(≈5 minutes; about 8 GiB of temp disk, removed at the end, as is the server).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _support import (
    ENGINECTL,
    GiB,
    MiB,
    Sample,
    add_quick,
    aws_bin,
    content_bytes,
    loadavg,
    log,
    machine,
    make_artifact,
    measure_in_process,
    median,
    process_cpu,
    quick_mode,
    read_all,
    rmtree,
    run_measured,
    s3_server,
    s5cmd_bin,
    scratch,
    timed,
)

PREFIX = "art"


def main() -> None:  # noqa: PLR0912, PLR0915 - one linear script reads best
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=8, help="files in the artifact")
    parser.add_argument("--file-mib", type=int, default=256, help="size of each file")
    parser.add_argument("--moto", action="store_true", help="use moto instead of s3rver")
    parser.add_argument("--cases", default="a,a2,a0,b,c,c2,d,e,f",
                        help="the cases to measure, by letter (a2 is (a'), c2 is (c'))")
    add_quick(parser)
    args = parser.parse_args()
    if "a" not in args.cases.split(","):
        parser.error(f"--cases {args.cases!r} must include a: every ratio is to (a)")
    if quick_mode(args.quick):
        args.rounds, args.files, args.file_mib = 1, 2, 1

    print(f"machine: {machine()}")
    with scratch("enginectl-fetch-s3-") as tmp, \
            s3_server(tmp, prefer="moto" if args.moto else "s3rver") as server:
        print(f"server: {server.kind} at {server.endpoint_url}")
        bucket = server.create_bucket()
        home = tmp / "home"
        env = dict(server.env)
        env.update(
            ENGINECTL_HOME=str(home),
            ENGINECTL_STORE_URL=f"s3://{bucket}/{PREFIX}",
            ENGINECTL_S3_ENDPOINT_URL=server.endpoint_url,
            ENGINECTL_REGISTRY_URL=f"sqlite:///{home / 'registry.db'}",
            ENGINECTL_CACHE_DIR=str(tmp / "cache"),
        )
        os.environ.update(env)  # the in-process cases read the same settings
        for name in set(os.environ) - set(env):
            if name.startswith("AWS_"):
                del os.environ[name]

        from registry.config import RegistryConfig
        from registry.context import Context
        from registry.ops.fetch import fetch
        from registry.ops.publish import publish

        log(f"writing {args.files} × {args.file_mib} MiB …")
        source = make_artifact(tmp / "src", files=args.files, size=args.file_mib * MiB)
        read_all(sorted(source.iterdir()))
        ctx = Context(RegistryConfig.from_env())
        published = []
        publish_s = timed(lambda: published.append(
            publish(ctx, source, kind="vllm", labels={"model": "bench"}, status="ready")))
        digest = published[0].digest
        size = published[0].manifest.size
        print(f"published {digest} ({size / GiB:.2f} GiB, {args.files} blobs) in {publish_s:.1f} s "
              f"({size / publish_s / 1e6:.0f} MB/s, hashing included)")
        rmtree(source)  # not needed any more; keeps the page cache for what is measured

        chosen = set(args.cases.split(","))
        aws = aws_bin() if "b" in chosen else None
        s5cmd = s5cmd_bin() if "d" in chosen else None
        blobs = f"s3://{bucket}/{PREFIX}/blobs/"
        client = server.client()
        keys = [entry["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{PREFIX}/blobs/") for entry in page.get("Contents", [])]
        assert len(keys) == args.files, keys

        def boto3_seq(dest: Path) -> None:
            dest.mkdir()
            for key in keys:
                client.download_file(bucket, key, str(dest / key.rsplit("/", 1)[1]))

        def boto3_threads(dest: Path) -> None:  # one thread per object, at most 8
            dest.mkdir()
            local = threading.local()

            def one(key: str) -> None:
                if not hasattr(local, "client"):
                    local.client = server.client()
                local.client.download_file(bucket, key, str(dest / key.rsplit("/", 1)[1]))

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(one, keys))

        urls = [client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                              ExpiresIn=24 * 3600) for key in keys]

        def ceiling(dest: Path) -> Sample:  # the server alone: parallel GETs to /dev/null
            def run() -> None:
                procs = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", url]) for url in urls]
                codes = [proc.wait() for proc in procs]
                assert codes == [0] * len(codes), codes
                dest.mkdir()
                for key in keys:  # the bytes check below counts the objects' sizes
                    with (dest / key.rsplit("/", 1)[1]).open("wb") as handle:
                        handle.truncate(size // len(keys))

            import resource

            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            sample = measure_in_process(run)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return Sample(sample.seconds, after.ru_utime - before.ru_utime
                          + after.ru_stime - before.ru_stime)

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
            ("(a0) enginectl fetch, SPLICE=0", "a0",
             lambda dest: run_measured([*cli, str(dest)], {**env, "ENGINECTL_S3_SPLICE": "0"})),
        ]
        if aws is not None:
            cases.append(("(b) aws s3 cp --recursive", "b", lambda dest: run_measured(
                [str(aws), "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url",
                 server.endpoint_url, blobs, str(dest)], env)))
        cases.append(("(c) boto3 download_file, sequential", "c",
                      lambda dest: measure_in_process(lambda: boto3_seq(dest))))
        cases.append(("(c') boto3 download_file, 8 threads", "c2",
                      lambda dest: measure_in_process(lambda: boto3_threads(dest))))
        if s5cmd is not None:
            cases.append(("(d) s5cmd cp", "d", lambda dest: run_measured(
                [str(s5cmd), "--endpoint-url", server.endpoint_url, "cp", f"{blobs}*",
                 f"{dest}/"], env)))
        if shutil.which("curl") is not None and args.files and size % args.files == 0:
            cases.append(("(f) server ceiling: 8 curl GETs at once", "f", ceiling))
        chosen = set(args.cases.split(","))
        cases = [case for case in cases if case[1] in chosen]
        missing = [name for name, path in (("aws", aws), ("s5cmd", s5cmd)) if path is None]
        if missing:
            print(f"not measured (could not install): {', '.join(missing)}")

        hit = "(e) enginectl fetch, cache hit"
        samples: dict[str, list[Sample]] = {name: [] for name, _, _ in cases}
        if "e" in chosen and "a" in chosen:
            samples[hit] = []
        server_cpu: dict[str, list[float]] = {name: [] for name in samples}
        for i in range(args.rounds):
            # Each round starts one case later: over len(cases) rounds each case runs once in
            # each position, so the server's leftover work from the case before is shared.
            for name, label, case in cases[i % len(cases):] + cases[:i % len(cases)]:
                log(f"round {i + 1}/{args.rounds}: {name} (load {loadavg()})")
                dest = tmp / f"out-{label}-{i}"
                if label in ("a", "a2", "a0"):
                    rmtree(tmp / "cache")
                os.sync()  # the last run's dirty pages are not this run's cost
                before = process_cpu(server.process.pid)
                samples[name].append(case(dest))
                server_cpu[name].append(process_cpu(server.process.pid) - before)
                got = content_bytes(dest)
                if got != size:
                    sys.exit(f"{name} produced {got} bytes, expected {size}")
                if label == "a" and "e" in chosen:  # (e): every blob is in the cache now
                    again = tmp / f"out-e-{i}"
                    os.sync()
                    before = process_cpu(server.process.pid)
                    samples[hit].append(run_measured([*cli, str(again)], env))
                    server_cpu[hit].append(process_cpu(server.process.pid) - before)
                    rmtree(again)
                rmtree(dest)

        base = median([x.seconds for x in samples["(a) enginectl fetch, cold cache"]])
        print(f"\n{size / GiB:.2f} GiB = {size} bytes in {args.files} objects; median of "
              f"{args.rounds} rounds; ratio = time / time of (a); CPU = client user+sys, "
              f"server = {server.kind} CPU; load average at the end {loadavg()}\n")
        print(f"{'case':<38} {'median s':>8} {'MB/s':>5} {'ratio':>5} {'CPU s':>5} "
              f"{'server':>6} {'peak RSS':>9}  runs (s)")
        for name, values in samples.items():
            wall = median([x.seconds for x in values])
            rss = [x.rss_mib for x in values if x.rss_mib is not None]
            shown = f"{max(rss):.0f} MiB" if rss else "-"
            print(f"{name:<38} {wall:8.2f} {size / wall / 1e6:5.0f} {wall / base:5.2f} "
                  f"{median([x.cpu for x in values]):5.1f} {median(server_cpu[name]):6.1f} "
                  f"{shown:>9}  {', '.join(f'{x.seconds:.1f}' for x in values)}")
        print("\nper round (the machine may be shared: CPU seconds vary less than wall time):")
        for name, values in samples.items():
            served = sum(server_cpu[name]) / (len(values) * size / GiB)
            print(f"{name:<38} CPU s {', '.join(f'{x.cpu:.2f}' for x in values)}; server CPU s "
                  f"{', '.join(f'{x:.2f}' for x in server_cpu[name])} ({served:.2f} per GiB)")
        print()
        ours = samples["(a) enginectl fetch, cold cache"]
        cpu_gib = median([x.cpu for x in ours]) / (size / GiB)
        rss = max((x.rss_mib for x in ours if x.rss_mib is not None), default=None)
        if rss is not None:
            print(f"(a) peak RSS {rss:.0f} MiB: {'meets' if rss < 64 else 'MISSES'} the < 64 MiB "
                  "target")
        s5 = "(d) s5cmd cp"
        if s5 in samples:
            ratio = median([x.seconds for x in samples[s5]]) / base
            paired = [peer.seconds / x.seconds for peer, x in zip(samples[s5], ours, strict=True)]
            print(f"(a) vs {s5} round by round: "
                  f"{', '.join(f'{x:.2f}x' for x in paired)} (median {median(paired):.2f}x)")
            peer_gib = median([x.cpu for x in samples[s5]]) / (size / GiB)
            print(f"(a) vs {s5}: {ratio:.2f}x s5cmd's speed, {'meets' if ratio >= 1 else 'MISSES'} "
                  f"the >= 1.0x target; CPU {cpu_gib:.2f} vs {peer_gib:.2f} CPU-s/GiB "
                  f"({cpu_gib / peer_gib:.2f}x): "
                  f"{'meets' if cpu_gib <= 1.1 * peer_gib else 'MISSES'} the <= 1.1x target")
        top = "(f) server ceiling: 8 curl GETs at once"
        if top in samples:
            share = median([x.seconds for x in samples[top]]) / base
            print(f"(a) vs {top}: {share:.2f}x the server's ceiling, "
                  f"{'meets' if share >= 0.8 else 'MISSES'} the >= 0.8x target")
        for name in ("(b) aws s3 cp --recursive", "(c) boto3 download_file, sequential"):
            if name in samples:
                ok = base <= median([x.seconds for x in samples[name]])
                print(f"(a) vs {name}: {'meets' if ok else 'MISSES'} the target "
                      f"(a) ≤ {name.split(' ')[0]}")
        if hit in samples:
            warm = median([x.seconds for x in samples[hit]])
            print(f"(e) cache hit {warm:.2f} s: {'meets' if warm < 1 else 'MISSES'} the < 1 s "
                  "target")
        ctx.close()


if __name__ == "__main__":
    main()
