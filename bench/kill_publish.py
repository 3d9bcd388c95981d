"""Crash safety of `enginectl import` and `enginectl fetch`: SIGKILL them at random moments,
then check everything.

Not a timing benchmark but a soak that needs real processes and real time, so it lives here
and never runs in CI. Each trial starts

    enginectl import DIR --kind trtllm-engine --model m --gpu h100 --tp 2 --ready

as a subprocess in its own process group against one shared store and registry
(ENGINECTL_HOME in a temp dir: `file://` store + SQLite; or, with `--backend s3pg`, a
bucket on moto's S3 server + a fresh PostgreSQL schema), SIGKILLs the group after a delay
drawn uniformly from [0, typical duration) (measured first, on a scratch home: an import of
new content, or in SAME after its first trial, a no-op re-import), and then asserts:

1. `enginectl fsck` exits 0 (every registered artifact's manifest and blobs, re-hashed);
2. every `ready` artifact fetches (`registry.ops.fetch.fetch`, verified, into a temp dir);
3. a retry `enginectl import` of the same DIR exits 0, and `enginectl fsck` is clean again.

Where the kill landed is read from what it left: nothing new, temp files only, some or all
blobs but no manifest, a manifest but no registry row, or a registered artifact (or the
import had already exited). Temp files and incomplete multipart uploads left behind are
counted too. Two halves: FRESH (new random rank files every trial) and SAME (one
directory, identical bytes, every trial). ENGINE_MB is the size range of a trial's engine.

With `--verb fetch`, each trial instead SIGKILLs `enginectl fetch DIGEST -o TARGET` of one
published artifact (ENGINE_MB, tp 2) after a delay uniform over a typical fetch, and then
requires: the target is absent or holds exactly what it held before (COLD: absent; SWAP: a
different artifact, fetched over with --force), or holds the new artifact whole, every file
re-hashed; every finished cache entry hashes to its name; a retry fetch exits 0 and the
target then verifies file by file. COLD: a new target and an empty cache each trial (the
kill lands in downloads); SWAP: a warm cache, a target that already holds another artifact,
`--force` (the kill can land in the swap). Partial or corrupt outcomes are failures.

Target: 0 failures. Run: `.venv/bin/python bench/kill_publish.py [--verb import|fetch]
[--trials 50] [--backend file|s3pg] [--seed N]` from the repository root (import: ≈8
minutes for 50 trials on the file backend, ≈7 for 20 on s3pg; temp data, servers and the
schema are removed at the end; `--quick`: one trial a half of 1–2 MB engines, to check the
script runs; the suite runs it so for each verb).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _support
from _support import (
    ENGINECTL,
    MiB,
    add_quick,
    loadavg,
    log,
    machine,
    median,
    quick_mode,
    rmtree,
    s3_server,
    scratch,
)

ENGINE_MB = (50, 200)
IMPORT_ARGS = ["--kind", "trtllm-engine", "--model", "m", "--gpu", "h100", "--tp", "2",
               "--ready", "--json"]


def make_engine(root: Path, rng: random.Random) -> None:
    """config.json (tp 2) and rank0/1.engine of random bytes, ENGINE_MB in total."""
    rmtree(root)
    root.mkdir(parents=True)
    config = {
        "version": "0.17.0",
        "pretrained_config": {"mapping": {"tp_size": 2, "pp_size": 1}},
        "build_config": {"max_batch_size": 64, "max_input_len": 2048, "max_seq_len": 4096},
    }
    (root / "config.json").write_text(json.dumps(config))
    total = rng.randint(ENGINE_MB[0], ENGINE_MB[1]) * MiB
    for rank in range(2):
        with (root / f"rank{rank}.engine").open("wb") as handle:
            left = total // 2
            while left:
                n = min(left, 16 * MiB)
                handle.write(rng.randbytes(n))
                left -= n


@dataclass
class State:
    blobs: int
    manifests: int
    rows: int
    temp_files: int


@dataclass
class Summary:
    trials: int = 0
    phases: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)


class Home:
    """One shared store + registry, as the `enginectl` processes see it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        # boto3 in this process reads credentials from os.environ, like the CLI does.
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        from registry.config import RegistryConfig
        from registry.context import Context

        self.ctx = Context(RegistryConfig.from_env(env))

    def state(self) -> State:
        from sqlalchemy import func, select

        from registry.sql.models import Artifact

        store = self.ctx.store
        blobs = sum(1 for _ in store.iter_blobs())
        manifests = sum(1 for _ in store.iter_manifests())
        with self.ctx.registry.session(readonly=True) as session:
            rows = session.scalar(select(func.count()).select_from(Artifact)) or 0
        return State(blobs, manifests, rows, self.leftovers())

    def leftovers(self) -> int:
        """What a killed writer left behind: temp files in a `file://` store, incomplete
        multipart uploads in a bucket (-1 when the server cannot list them)."""
        store: Any = self.ctx.store
        if store.url.startswith("file://"):
            root = Path(store.url.removeprefix("file://"))
            return sum(1 for _ in root.rglob(".*.tmp"))
        try:
            listing = store.bucket.client.list_multipart_uploads(
                Bucket=store.bucket.name, Prefix=store.prefix)
        except Exception:  # noqa: BLE001 - a test server may not implement the call
            return -1
        return len(listing.get("Uploads", []))

    def ready_digests(self) -> list[str]:
        from registry.sql import records

        with self.ctx.registry.session(readonly=True) as session:
            return [r.digest for r in records.list_artifacts(session, status="ready")]

    def fetch_all(self, scratch_dir: Path) -> list[str]:
        from registry.errors import EnginectlError
        from registry.ops.fetch import fetch

        problems = []
        for digest in self.ready_digests():
            target = scratch_dir / "fetched"
            try:
                fetch(self.ctx, digest, target)
            except EnginectlError as exc:
                problems.append(f"fetch {digest[:19]}: {exc}")
            finally:
                rmtree(target)
        return problems

    def close(self) -> None:
        self.ctx.close()


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                          timeout=600)


def import_once(engine: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = run([ENGINECTL, "import", str(engine), *IMPORT_ARGS], env)
    if done.returncode != 0:
        raise RuntimeError(f"import failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def phase_of(before: State, after: State, exited: bool) -> str:
    if exited:
        return "had already exited"
    if after.rows > before.rows:
        return "registered, before exit"
    if after.manifests > before.manifests:
        return "manifest stored, not registered"
    if after.blobs > before.blobs:
        return "some or all blobs stored, no manifest"
    if after.temp_files > before.temp_files:
        return "writing the first blobs (temp files left)"
    return "nothing new stored (start-up, hashing or no-op)"


def trial(number: int, engine: Path, home: Home, *, delay: float, tmp: Path,
          summary: Summary) -> None:
    env = home.env
    before = home.state()
    process = subprocess.Popen([ENGINECTL, "import", str(engine), *IMPORT_ARGS], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    time.sleep(delay)
    exited = process.poll() is not None
    if not exited:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.stderr is not None
    stderr = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    if exited and process.returncode != 0:
        summary.failures.append(f"trial {number}: import failed on its own: {stderr[-500:]}")
    after = home.state()
    phase = phase_of(before, after, exited)
    summary.phases[phase] += 1
    summary.trials += 1

    def check(what: str, argv: list[str]) -> None:
        done = run(argv, env)
        if done.returncode != 0:
            summary.failures.append(f"trial {number} ({phase}, {delay:.2f} s): {what} exited "
                                    f"{done.returncode}: {(done.stdout + done.stderr)[-800:]}")

    check("fsck after kill", [ENGINECTL, "fsck"])
    for problem in home.fetch_all(tmp):
        summary.failures.append(f"trial {number} ({phase}): {problem}")
    check("retry import", [ENGINECTL, "import", str(engine), *IMPORT_ARGS])
    check("fsck after retry", [ENGINECTL, "fsck"])
    final = home.state()
    log(f"  trial {number:3d}: kill at {delay:5.2f} s → {phase}; blobs {final.blobs}, "
        f"manifests {final.manifests}, rows {final.rows}, leftovers {final.temp_files}; "
        f"failures so far {len(summary.failures)}")


@contextmanager
def backend_env(kind: str, tmp: Path, stack: ExitStack) -> Iterator[dict[str, str]]:
    """The environment of a fresh shared store + registry for *kind* ('file' or 's3pg')."""
    from _support import client_env

    home = tmp / "home"
    if kind == "file":
        env = client_env("unused", "unused", tmp)
        env.update(ENGINECTL_HOME=str(home))
        for name in ("ENGINECTL_STORE_URL", "ENGINECTL_REGISTRY_URL", "ENGINECTL_CACHE_DIR",
                     "ENGINECTL_S3_ENDPOINT_URL"):
            env.pop(name, None)
        yield env
        return
    from resolve_scale import postgres_schema

    # s3rver 3.7.1 answers ListObjectsV2 with InternalError whenever MaxKeys is below the
    # number of keys (a truncated listing), which enginectl's one-key bucket check sends
    # after every 404; moto lists correctly.
    server = stack.enter_context(s3_server(tmp, prefer="moto"))
    bucket = server.create_bucket()
    url = stack.enter_context(postgres_schema())
    env = dict(server.env)
    env.update(ENGINECTL_HOME=str(home), ENGINECTL_STORE_URL=f"s3://{bucket}/kill",
               ENGINECTL_S3_ENDPOINT_URL=server.endpoint_url, ENGINECTL_REGISTRY_URL=url)
    env.pop("ENGINECTL_CACHE_DIR", None)
    log(f"backend: {server.kind} bucket {bucket} + PostgreSQL schema")
    yield env


def typical_duration(kind: str, tmp: Path, rng: random.Random) -> tuple[float, float]:
    """(import of new content, no-op re-import) wall seconds, medians of 3, on a scratch
    home that already holds an artifact (so the registry's first-open migration is not
    counted)."""
    firsts, again = [], []
    with ExitStack() as stack, backend_env(kind, tmp / "probe", stack) as env:
        (tmp / "probe").mkdir(exist_ok=True)
        for i in range(2 if _support.QUICK else 4):
            engine = tmp / "probe" / f"engine{i}"
            make_engine(engine, rng)
            first = import_once(engine, env)
            repeat = import_once(engine, env)
            if i:
                firsts.append(first)
                again.append(repeat)
            rmtree(engine)
    rmtree(tmp / "probe")
    return median(firsts), median(again)


# --- fetch -----------------------------------------------------------------------------------


def tree_digests(root: Path) -> dict[str, str] | None:
    """Relative path -> xxh3-128 of every file under *root* (None when it does not exist),
    but the marker a fetch leaves beside the artifact's files (not its content)."""
    from registry.identity.digest import digest_file
    from registry.identity.manifest import FILL_MARKER

    if not root.exists():
        return None
    return {p.relative_to(root).as_posix(): str(digest_file(p, with_sha256=False).xxh3)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != FILL_MARKER}


def manifest_digests(home: Home, digest: str) -> dict[str, str]:
    from registry.ops.fetch import load_manifest

    return {f.path: str(f.xxh3) for f in load_manifest(home.ctx, digest).files}


def bad_cache_entries(cache: Path) -> list[str]:
    """Finished cache entries (not `.tmp-*` fills, not stamps) whose bytes are not their name."""
    from registry.identity.digest import digest_file

    bad = []
    for path in sorted((cache / "xxh3-128").glob("*/*")):
        if path.name.startswith("."):
            continue
        if digest_file(path, with_sha256=False).xxh3.hex != path.parent.name + path.name:
            bad.append(str(path))
    return bad


def fetch_trial(number: int, half: str, home: Home, digest: str, *, previous: dict[str, str]
                | None, delay: float, target: Path, cache: Path, summary: Summary) -> None:
    env = {**home.env, "ENGINECTL_CACHE_DIR": str(cache)}
    wanted = manifest_digests(home, digest)
    argv = [ENGINECTL, "fetch", digest, "-o", str(target), *(["--force"] if previous else [])]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(delay)
    exited = process.poll() is not None
    if not exited:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.stderr is not None
    stderr = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    if exited and process.returncode != 0:
        summary.failures.append(f"trial {number}: fetch failed on its own: {stderr[-500:]}")
    found = tree_digests(target)
    staging = len(list(target.parent.glob(f".{target.name}.*")))
    if found == wanted:
        outcome = "had already exited" if exited else "new content whole, before exit"
    elif found == previous:
        outcome = "previous content whole" if previous else "target absent"
    elif found is None and previous is not None:
        outcome = "target absent mid-swap (put back by the next fetch)"
    else:
        outcome = "PARTIAL"
        summary.failures.append(f"trial {number} ({delay:.2f} s): the target holds "
                                f"{len(found or {})} files, neither old nor new whole")
    summary.phases[f"{outcome}{'; staging left' if staging else ''}"] += 1
    summary.trials += 1
    for bad in bad_cache_entries(cache):
        summary.failures.append(f"trial {number}: CORRUPT cache entry {bad}")
    if outcome.startswith("target absent mid-swap"):
        # a fetch without --force must put the set-aside content back and refuse
        run([ENGINECTL, "fetch", digest, "-o", str(target)], env)
        if tree_digests(target) != previous:
            summary.failures.append(f"trial {number}: the previous content did not come back")
    retry = run([*argv[:5], "--force"], env)
    if retry.returncode != 0:
        summary.failures.append(f"trial {number}: retry exited {retry.returncode}: "
                                f"{retry.stderr[-500:]}")
    elif tree_digests(target) != wanted:
        summary.failures.append(f"trial {number}: after the retry the target is not whole")
    left = len(list(target.parent.glob(f".{target.name}.*")))
    if left:
        summary.failures.append(f"trial {number}: {left} staging dirs left after the retry")
    log(f"  {half} trial {number:3d}: kill at {delay:5.2f} s → {outcome}; staging {staging}; "
        f"failures so far {len(summary.failures)}")


def fetch_main(args: argparse.Namespace, rng: random.Random, tmp: Path) -> dict[str, Summary]:
    halves: dict[str, Summary] = {}
    with ExitStack() as stack, backend_env(args.backend, tmp, stack) as env:
        home = Home(env)
        stack.callback(home.close)
        digests = []
        for name in ("new", "old"):
            engine = tmp / f"engine-{name}"
            make_engine(engine, rng)
            done = run([ENGINECTL, "import", str(engine), *IMPORT_ARGS], env)
            digests.append(json.loads(done.stdout)["digest"])
            rmtree(engine)
        new, old = digests
        probe = [timed_fetch(env, new, tmp / f"probe{i}", tmp / f"probe-cache{i}")
                 for i in range(1 if _support.QUICK else 3)]
        cold = median(probe)
        print(f"typical cold fetch: {cold:.2f} s (median of 3, whole process; load {loadavg()})")
        for half in ("COLD", "SWAP"):
            count = args.trials // 2 if half == "COLD" else args.trials - args.trials // 2
            summary = halves[half] = Summary()
            shared_cache = tmp / "swap-cache"
            for number in range(1, count + 1):
                target = tmp / half.lower() / f"t{number}"
                target.parent.mkdir(exist_ok=True)
                if half == "COLD":
                    cache, previous = tmp / "cold-cache" / str(number), None
                else:
                    cache = shared_cache
                    run([ENGINECTL, "fetch", old, "-o", str(target)],
                        {**env, "ENGINECTL_CACHE_DIR": str(cache)})
                    previous = tree_digests(target)
                window = cold if half == "COLD" else max(0.5, cold / 2)
                fetch_trial(number, half, home, new, previous=previous,
                            delay=rng.uniform(0, window), target=target, cache=cache,
                            summary=summary)
                rmtree(target)
                if half == "COLD":
                    rmtree(cache)
            print(f"\n{half}: {summary.trials} trials, {len(summary.failures)} failures")
            for phase, n in summary.phases.most_common():
                print(f"  killed when: {phase:<62} {n:3d}")
            for failure in summary.failures:
                print(f"  FAILURE {failure}")
    return halves


def timed_fetch(env: dict[str, str], digest: str, target: Path, cache: Path) -> float:
    start = time.perf_counter()
    done = run([ENGINECTL, "fetch", digest, "-o", str(target)],
               {**env, "ENGINECTL_CACHE_DIR": str(cache)})
    if done.returncode != 0:
        raise RuntimeError(f"fetch failed: {done.stderr[-2000:]}")
    elapsed = time.perf_counter() - start
    rmtree(target)
    rmtree(cache)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verb", choices=("import", "fetch"), default="import")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--backend", choices=("file", "s3pg"), default="file")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        global ENGINE_MB
        args.trials, ENGINE_MB = 2, (1, 2)
    rng = random.Random(args.seed)  # noqa: S311 - kill moments and test bytes, not secrets
    print(f"machine: {machine()}")
    if args.verb == "fetch":
        print(f"fetch: backend {args.backend}, {args.trials} trials, seed {args.seed}, "
              f"engines {ENGINE_MB[0]}–{ENGINE_MB[1]} MB (tp 2)")
        with scratch("enginectl-kill-fetch-") as tmp:
            halves = fetch_main(args, rng, tmp)
        total = sum(len(s.failures) for s in halves.values())
        print(f"\ntotal: {sum(s.trials for s in halves.values())} trials, {total} failures "
              f"({'meets' if total == 0 else 'MISSES'} the 0-failure target)")
        sys.exit(1 if total else 0)
    print(f"backend {args.backend}, {args.trials} trials, seed {args.seed}, "
          f"engines {ENGINE_MB[0]}–{ENGINE_MB[1]} MB (tp 2)")
    halves: dict[str, Summary] = {}
    with scratch("enginectl-kill-") as tmp:
        (tmp / "probe").mkdir()
        first, noop = typical_duration(args.backend, tmp, rng)
        print(f"typical import: {first:.2f} s for new content, {noop:.2f} s for a no-op "
              f"re-import (median of 3, whole process; load {loadavg()})")
        for half in ("FRESH", "SAME"):
            count = args.trials // 2 if half == "FRESH" else args.trials - args.trials // 2
            summary = halves[half] = Summary()
            log(f"{half}: {count} trials")
            work = tmp / half.lower()
            work.mkdir()
            with ExitStack() as stack, backend_env(args.backend, work, stack) as env:
                home = Home(env)
                stack.callback(home.close)
                engine = work / "engine"
                make_engine(engine, rng)
                for number in range(1, count + 1):
                    if half == "FRESH" and number > 1:
                        make_engine(engine, rng)
                    # SAME: after the first trial every import is a no-op re-import
                    window = first if half == "FRESH" or number == 1 else noop
                    delay = rng.uniform(0, window)
                    trial(number, engine, home, delay=delay, tmp=work, summary=summary)
                final = home.state()
                print(f"\n{half}: {summary.trials} trials, {len(summary.failures)} failures; "
                      f"at the end {final.rows} artifacts, {final.blobs} blobs, "
                      f"{final.manifests} manifests, {final.temp_files} temp files / incomplete "
                      "uploads left in the store")
                for phase, n in summary.phases.most_common():
                    print(f"  killed when: {phase:<48} {n:3d}")
                for failure in summary.failures:
                    print(f"  FAILURE {failure}")
            rmtree(work)
    total = sum(len(s.failures) for s in halves.values())
    print(f"\ntotal: {sum(s.trials for s in halves.values())} trials, {total} failures "
          f"({'meets' if total == 0 else 'MISSES'} the 0-failure target)")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
