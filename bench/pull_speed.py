"""How fast `enginectl pull` places a 2 GiB artifact, against `enginectl fetch` of the same bytes.

Publishes a checkpoint of 8 files × 256 MiB of random bytes (`hf-checkpoint`) and the vLLM
entry that serves it (a small artifact whose input is the checkpoint, with the serve argv a
build records; ready, with a CPU smoke report), into a `file://` store and into an S3 server
on 127.0.0.1 (s3rver, installed under ~/.cache/enginectl-bench on first use; moto when it
cannot be had, which the output says), each with a SQLite registry. Then, per store, in
interleaved rounds (median of ROUNDS), wall clock of the whole process, `sync` before every
run and the `file://` store's blobs read into the page cache first:

  (a)  `enginectl fetch CHECKPOINT -o DIR`, cache emptied first
  (b)  `enginectl pull ENTRY -o DIR`, cache emptied first: the entry and its checkpoint
       (the same 2 GiB), plus serve.json — **target: as fast as (a), within 10 %**
  (c)  `enginectl pull ENTRY -o NEW_DIR`, every blob in the cache — **target < 0.5 s**
  (d)  `enginectl pull ENTRY -o DIR` again into the directory a pull filled (cache hit)
  (e)  `enginectl pull --model bench --gpu cpu -o NEW_DIR` (resolve in the registry, which
       imports SQLAlchemy's ORM), cache hit

The runtime is named with `--executable` (pull checks it exists and never runs it), so the
numbers are the placement's alone.
Run: `.venv/bin/python bench/pull_speed.py [--rounds N] [--moto] [--files N --file-mib M]
[--file-only]` from the repository root (≈6 minutes; about 10 GiB of temp disk, removed at
the end, as is the server).
`--quick`: one round of 2 × 1 MiB on moto, to check the script runs (the suite does).
"""

from __future__ import annotations

import argparse
import json
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
    loadavg,
    log,
    machine,
    make_artifact,
    median,
    quick_mode,
    read_all,
    rmtree,
    run_measured,
    s3_server,
    scratch,
)

TARGET_RATIO = 0.9
TARGET_HIT_S = 0.5


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def publish_pair(env: dict[str, str], source: Path, entry_dir: Path) -> tuple[str, str, int]:
    """The checkpoint and its entry, published with the library in this process."""
    os.environ.update(env)
    from pipeline.recipe.matrix import Shape
    from pipeline.recipe.schema import VllmServe
    from pipeline.stages.serve import VllmServing, vllm_argv
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.ops.publish import publish
    from registry.sql import smoke_records

    with Context(RegistryConfig.from_env()) as ctx:
        checkpoint = publish(ctx, source, kind="hf-checkpoint", labels={"model": "bench"})
        shape = Shape(max_batch_size=8, max_input_len=1024, max_seq_len=2048)
        argv = vllm_argv("/builder/venv/bin/python", VllmServing(shape, VllmServe(), cpu=True),
                         model_dir=Path("{model_dir}"), served_name="bench")
        serve = {"argv": argv, "model_dir": "input"}
        entry_dir.mkdir(exist_ok=True)
        (entry_dir / "enginectl-entry.json").write_text(json.dumps({"serve": serve}))
        entry = publish(ctx, entry_dir, kind="vllm", status="ready",
                        labels={"model": "bench", "runtime": "vllm", "quant": "bf16",
                                **shape.model_dump(exclude={"name"})},
                        inputs=(checkpoint.digest,), serve=serve)
        with ctx.registry.session() as session:
            smoke_records.add_smoke_report(session, entry.digest, True,
                                           {"best_output_tokens_per_s": 100.0}, gpu="CPU")
    return checkpoint.digest, entry.digest, checkpoint.manifest.size


def bench_store(name: str, tmp: Path, env: dict[str, str], args: argparse.Namespace, *,
                source: Path, blobs: Callable[[], list[Path]]) -> dict[str, list[Sample]]:
    checkpoint, entry, size = publish_pair(env, source, tmp / f"entry-{name}")
    log(f"{name}: published {checkpoint} ({size / GiB:.2f} GiB) and its entry {entry}")
    fetch = [ENGINECTL, "fetch", checkpoint, "-o"]
    pull = [ENGINECTL, "pull", entry, "--executable", sys.executable, "-o"]
    by_model = [ENGINECTL, "pull", "--model", "bench", "--gpu", "cpu", "--executable",
                sys.executable, "-o"]
    names = ("(a) fetch, cold cache", "(b) pull, cold cache", "(c) pull, cache hit, new dir",
             "(d) pull again into its dir", "(e) pull --model, cache hit")
    samples: dict[str, list[Sample]] = {n: [] for n in names}
    cache = Path(env["ENGINECTL_CACHE_DIR"])
    for i in range(args.rounds):
        for label, argv in (("a", fetch), ("b", pull)):
            log(f"{name} round {i + 1}/{args.rounds}: ({label}) (load {loadavg()})")
            dest = tmp / f"out-{name}-{label}-{i}"
            rmtree(cache)
            read_all(blobs())
            os.sync()
            samples[names[0 if label == "a" else 1]].append(run_measured([*argv, str(dest)],
                                                                         env))
            placed = tree_bytes(dest)
            if placed < size:
                sys.exit(f"({label}) placed {placed} bytes, expected at least {size}")
            if label == "b":
                os.sync()
                again = tmp / f"out-{name}-c-{i}"
                samples[names[2]].append(run_measured([*pull, str(again)], env))
                samples[names[3]].append(run_measured([*pull, str(dest)], env))
                resolved = tmp / f"out-{name}-e-{i}"
                samples[names[4]].append(run_measured([*by_model, str(resolved)], env))
                for path in (again, resolved):
                    rmtree(path)
            rmtree(dest)
    return samples


def report(name: str, samples: dict[str, list[Sample]], size: int, files: int) -> None:
    fetch = median([x.seconds for x in samples["(a) fetch, cold cache"]])
    print(f"\n{name}: {size / GiB:.2f} GiB in {files} files + a 1 KiB entry; median of "
          f"{len(samples['(a) fetch, cold cache'])} rounds; load average now {loadavg()}")
    print(f"{'case':<32} {'median s':>8} {'MB/s':>6} {'vs fetch':>8} {'CPU s':>6} "
          f"{'peak RSS':>9}  runs (s)")
    for case, values in samples.items():
        wall = median([x.seconds for x in values])
        rss = [x.rss_mib for x in values if x.rss_mib is not None]
        cold = case.startswith(("(a)", "(b)"))
        speed = f"{size / wall / 1e6:6.0f}" if cold else f"{'-':>6}"
        ratio = f"{fetch / wall:8.2f}" if cold else f"{'-':>8}"
        print(f"{case:<32} {wall:8.2f} {speed} {ratio} {median([x.cpu for x in values]):6.2f} "
              f"{(f'{max(rss):.0f} MiB' if rss else '-'):>9}  "
              f"{', '.join(f'{x.seconds:.2f}' for x in values)}")
    pull = median([x.seconds for x in samples["(b) pull, cold cache"]])
    hit = median([x.seconds for x in samples["(c) pull, cache hit, new dir"]])
    print(f"(b) runs at {fetch / pull:.2f}× fetch's speed: "
          f"{'meets' if fetch / pull >= TARGET_RATIO else 'MISSES'} the ≥ {TARGET_RATIO}× target")
    print(f"(c) cache hit {hit:.2f} s: {'meets' if hit < TARGET_HIT_S else 'MISSES'} the "
          f"< {TARGET_HIT_S} s target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--moto", action="store_true", help="use moto instead of s3rver")
    parser.add_argument("--file-only", action="store_true", help="skip the S3 half")
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rounds, args.files, args.file_mib = 1, 2, 1
    print(f"machine: {machine()}")
    with scratch("enginectl-pull-") as tmp:
        log(f"writing {args.files} × {args.file_mib} MiB …")
        source = make_artifact(tmp / "src", files=args.files, size=args.file_mib * MiB)
        (source / "config.json").write_text('{"model_type": "llama"}')
        size = tree_bytes(source)
        base = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}

        def env_for(name: str, store_url: str, **extra: str) -> dict[str, str]:
            home = tmp / f"home-{name}"
            return {**base, "ENGINECTL_HOME": str(home), "ENGINECTL_STORE_URL": store_url,
                    "ENGINECTL_REGISTRY_URL": f"sqlite:///{home / 'registry.db'}",
                    "ENGINECTL_CACHE_DIR": str(home / "cache"), **extra}

        store = tmp / "store"
        file_env = env_for("file", store.as_uri())
        samples = bench_store("file", tmp, file_env, args, source=source,
                              blobs=lambda: sorted(p for p in (store / "blobs").rglob("*")
                                             if p.is_file()))
        report("file://", samples, size, args.files + 1)
        if args.file_only:
            return
        with s3_server(tmp, prefer="moto" if args.moto else "s3rver") as server:
            bucket = server.create_bucket()
            s3_env = env_for("s3", f"s3://{bucket}/enginectl",
                             ENGINECTL_S3_ENDPOINT_URL=server.endpoint_url,
                             **{k: v for k, v in server.env.items() if k.startswith("AWS_")})
            samples = bench_store("s3", tmp, s3_env, args, source=source, blobs=list)
            report(f"S3 ({server.kind} on 127.0.0.1)", samples, size, args.files + 1)


if __name__ == "__main__":
    main()
