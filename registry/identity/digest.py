"""Content identity: a tiny value type that carries its algorithm.

Two algorithms are used: `xxh3-128` for file bytes (fast enough to verify while streaming)
and `sha256` for manifests and anything hashed from canonical JSON.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

import xxhash

from registry.identity.canonical import canonical_json

Algorithm = Literal["sha256", "xxh3-128"]
_HEX_LEN: Final[dict[str, int]] = {"sha256": 64, "xxh3-128": 32}
_PATTERN: Final = re.compile(r"^(sha256|xxh3-128):([0-9a-f]+)$")
CHUNK: Final = 1 << 20
RELEASE: Final = 32 << 20
"""Hashed pages of a mapped file are dropped from the mapping in steps this big: each drop
interrupts every thread's CPU (a TLB flush), so not one per CHUNK."""


@dataclass(frozen=True, order=True, slots=True)
class Digest:
    """`algorithm:hex`, e.g. `sha256:9f86…`. Parsing is strict; `str()` round-trips."""

    algorithm: Algorithm
    hex: str

    def __post_init__(self) -> None:
        expected = _HEX_LEN.get(self.algorithm)
        if expected is None:
            raise ValueError(f"unknown digest algorithm {self.algorithm!r}")
        if len(self.hex) != expected or not re.fullmatch(r"[0-9a-f]+", self.hex):
            raise ValueError(f"not a {self.algorithm} digest: {self.hex!r}")

    @classmethod
    def parse(cls, text: str) -> Digest:
        match = _PATTERN.match(text)
        if match is None:
            raise ValueError(
                f"not a digest: {text!r} (expected 'sha256:<64 hex>' or 'xxh3-128:<32 hex>')"
            )
        algorithm: Algorithm = "sha256" if match.group(1) == "sha256" else "xxh3-128"
        return cls(algorithm, match.group(2))

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def short(self) -> str:
        return self.hex[:12]


def sha256_of(data: bytes) -> Digest:
    return Digest("sha256", hashlib.sha256(data).hexdigest())


def sha256_of_json(value: object) -> Digest:
    """The digest of *value*'s canonical JSON."""
    return sha256_of(canonical_json(value))


@dataclass(frozen=True, slots=True)
class FileDigests:
    size: int
    xxh3: Digest
    sha256: Digest | None


def digest_file(path: Path, *, with_sha256: bool = True, mapped: bool = False) -> FileDigests:
    """Hash one file in a single pass: xxh3-128 always, sha256 when asked.

    *mapped* hashes through mmap, which skips the kernel-to-user copy of a read loop (about
    1.5x faster from the page cache, bench/verify_speed.py). Only for files enginectl owns,
    such as the fetch cache's: a file truncated by someone else while it is mapped kills
    the process (SIGBUS), so a user's source directory is read with the loop."""
    fast = xxhash.xxh3_128()
    slow = hashlib.sha256() if with_sha256 else None
    size = 0
    with path.open("rb") as handle:
        if mapped:
            size = os.fstat(handle.fileno()).st_size
            if size:
                with mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as region:
                    region.madvise(mmap.MADV_SEQUENTIAL)
                    update_mapped(region, 0, size, fast, slow)
        else:
            while chunk := handle.read(CHUNK):
                size += len(chunk)
                fast.update(chunk)
                if slow is not None:
                    slow.update(chunk)
    return FileDigests(
        size=size,
        xxh3=Digest("xxh3-128", fast.hexdigest()),
        sha256=Digest("sha256", slow.hexdigest()) if slow is not None else None,
    )


class Hasher(Protocol):
    def update(self, data: memoryview, /) -> None: ...


def update_mapped(region: mmap.mmap, start: int, end: int, *hashers: Hasher | None,
                  release: bool = True) -> None:
    """Feed bytes [start, end) of a mapped file to every hasher, CHUNK bytes at a time (both
    hashes of a chunk run while it is in the CPU cache), without copying them. Each chunk
    is unmapped from this process once hashed (the page cache keeps it), so hashing a big
    file does not show up as resident memory; `release=False` leaves that to the caller
    (`release_mapped`), who hashes a file in many small steps."""
    released = start if start % mmap.PAGESIZE == 0 else end  # unaligned: nothing released
    with memoryview(region) as view:
        for offset in range(start, end, CHUNK):
            stop = min(offset + CHUNK, end)
            with view[offset:stop] as piece:
                for hasher in hashers:
                    if hasher is not None:
                        hasher.update(piece)
            if release:
                released = release_mapped(region, released, stop, final=stop == end)


def release_mapped(region: mmap.mmap, released: int, hashed: int, *, final: bool) -> int:
    """Unmap the hashed pages [released, hashed) of *region* once they add up to RELEASE
    (or at the *final* step) and return the new start of what is still mapped (from the
    page *released* is in: madvise works on whole pages)."""
    released -= released % mmap.PAGESIZE
    if hashed - released >= RELEASE or (final and released < hashed):
        region.madvise(mmap.MADV_DONTNEED, released, hashed - released)
        return hashed
    return released


def tree_digest(root: Path) -> Digest:
    """The sha256 of a directory's content: every regular file's relative path, size and
    xxh3-128, as canonical JSON. Links and special files are refused, not followed."""
    entries = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise ValueError(f"{path} is a link or special file; refusing to digest it")
        if path.is_file():
            digests = digest_file(path, with_sha256=False)
            entries.append(
                {"path": path.relative_to(root).as_posix(), "size": digests.size,
                 "xxh3": str(digests.xxh3)}
            )
    return sha256_of_json(entries)
