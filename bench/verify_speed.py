"""How fast one core verifies file bytes: xxh3-128, sha256, and both in one pass.

Measures, on a 2 GiB file of random bytes already in the page cache, one thread, median (and
best) of RUNS rounds; the cases are interleaved round by round so that noise from other work
on the machine spreads over all of them:

- `registry.identity.digest.digest_file(path, with_sha256=False, mapped=True)`: what fetch pays per
  byte to verify (S3 parts, `file://` copies and cache entries are hashed through mmap by
  `registry.identity.digest.update_mapped`);
- `digest_file(path, with_sha256=False)`: the read loop (`handle.read(CHUNK)`, CHUNK = 1 MiB)
  that publish uses on a user's source files, which could be truncated while mapped;
- raw `xxhash.xxh3_128` over the same file with `read(1 MiB)`, `read(16 MiB)`, and
  `readinto` a reused 1 MiB / 16 MiB buffer (no allocation per chunk), and over a 256 MiB
  buffer already in memory (the hash alone, no read), over an `mmap` of the file (no copy
  into user space), and the bare `readinto` loop with no hash (the read ceiling);
- `hashlib.sha256` alone (1 MiB reads);
- `digest_file(path, mapped=True)` (xxh3-128 + sha256, one pass): what `fetch --verify
  strict` costs per byte; `digest_file(path)`: the same with the read loop (publish).

Target: xxh3-128 of a file from page cache ≥ 3 GB/s on one core (GB = 10⁹ bytes).
Run: `.venv/bin/python bench/verify_speed.py` from the repository root (≈1 minute, 2 GiB of
temp disk, removed afterwards; `--quick`: one round over 8 MiB, to check the script runs).
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import xxhash
from _support import (
    GiB,
    MiB,
    add_quick,
    log,
    machine,
    median,
    quick_mode,
    read_all,
    scratch,
    timed,
    write_random,
)

from registry.identity.digest import CHUNK, digest_file

SIZE = 2 * GiB
RUNS = 5
TARGET_GBPS = 3.0


def read_hash(path: Path, factory: Callable[[], object], chunk: int) -> None:
    hasher: object = factory()
    update = hasher.update  # type: ignore[attr-defined]
    with path.open("rb") as handle:
        while data := handle.read(chunk):
            update(data)


def readinto_hash(path: Path, chunk: int, *, hash_it: bool = True) -> None:
    hasher = xxhash.xxh3_128()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as handle:
        while n := handle.readinto(buf):
            if hash_it:
                hasher.update(view[:n])


def mmap_hash(path: Path) -> None:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        xxhash.xxh3_128(mapped).digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    size, runs = (8 * MiB, 1) if quick_mode(parser.parse_args().quick) else (SIZE, RUNS)
    print(f"machine: {machine()}")
    print(f"file: {size / GiB:.2f} GiB random bytes from page cache; CHUNK = {CHUNK // MiB} MiB; "
          f"{runs} interleaved rounds; GB/s = 10^9 bytes/s\n")
    with scratch("enginectl-verify-") as tmp:
        path = tmp / "big.bin"
        log(f"writing {size / GiB:.2f} GiB …")
        write_random(path, size)
        read_all([path])
        read_all([path])
        memory = os.urandom(min(256 * MiB, size))
        cases: list[tuple[str, int, Callable[[], object]]] = [
            ("digest_file(with_sha256=False, mapped=True)  [fetch]", size,
             lambda: digest_file(path, with_sha256=False, mapped=True)),
            ("digest_file(with_sha256=False)  [read 1 MiB: publish]", size,
             lambda: digest_file(path, with_sha256=False)),
            ("raw xxh3_128, read(1 MiB)  [= publish's loop]", size,
             lambda: read_hash(path, xxhash.xxh3_128, 1 * MiB)),
            ("raw xxh3_128, read(16 MiB)", size,
             lambda: read_hash(path, xxhash.xxh3_128, 16 * MiB)),
            ("raw xxh3_128, readinto(reused 256 KiB)", size,
             lambda: readinto_hash(path, 256 << 10)),
            ("raw xxh3_128, readinto(reused 1 MiB)", size,
             lambda: readinto_hash(path, 1 * MiB)),
            ("raw xxh3_128, readinto(reused 16 MiB)", size,
             lambda: readinto_hash(path, 16 * MiB)),
            ("raw xxh3_128 of an mmap of the file", size, lambda: mmap_hash(path)),
            (f"xxh3_128 of {len(memory) // MiB} MiB in memory (no I/O)", len(memory),
             lambda: xxhash.xxh3_128(memory).digest()),
            ("readinto(reused 1 MiB), no hash  [read ceiling]", size,
             lambda: readinto_hash(path, 1 * MiB, hash_it=False)),
            ("sha256 alone, read 1 MiB", size,
             lambda: read_hash(path, hashlib.sha256, 1 * MiB)),
            ("digest_file(path, mapped=True)  [xxh3+sha256 = strict]", size,
             lambda: digest_file(path, mapped=True)),
            ("digest_file(path)  [xxh3 + sha256, read loop: publish]", size,
             lambda: digest_file(path)),
        ]
        times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        for round_ in range(runs):
            log(f"round {round_ + 1}/{runs}")
            for label, _, action in cases:
                times[label].append(timed(action))
        print(f"{'case':<56} {'median GB/s':>11} {'best GB/s':>10}")
        results = {}
        for label, size, _ in cases:
            results[label] = size / median(times[label]) / 1e9
            best = size / min(times[label]) / 1e9
            print(f"{label:<56} {results[label]:11.2f} {best:10.2f}")
        first = results[cases[0][0]]
        verdict = "meets" if first >= TARGET_GBPS else "MISSES"
        print(f"\nfetch's xxh3 verification: {first:.2f} GB/s (median) {verdict} the "
              f"≥ {TARGET_GBPS} GB/s target")


if __name__ == "__main__":
    main()
