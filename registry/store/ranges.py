"""Parallel ranged reads into one file, checked in order: the engine of a fast, verified fetch.

Each range is fetched on a shared pool and streamed straight to its offset in the file; the
calling thread is told about the ranges in file order as they complete (to hash them from
the file), so verification overlaps the transfer. No part is held in memory: what one fetch
costs is the pool's threads and their stream buffers, however large the blobs.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, wait
from typing import Final

from registry.identity.digest import CHUNK, Hasher


def split(start: int, end: int, part_size: int) -> list[tuple[int, int]]:
    """[start, end) cut into consecutive `(start, end)` parts of *part_size* (the last shorter)."""
    if part_size <= 0:
        raise ValueError(f"part size must be positive, got {part_size}")
    return [(offset, min(offset + part_size, end)) for offset in range(start, end, part_size)]


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def read_exactly_into(fd: int, offset: int, buffer: bytearray) -> None:
    """Fill *buffer* with the bytes of *fd* from *offset*; OSError when the file ends first."""
    done = 0
    with memoryview(buffer) as view:
        while done < len(buffer):
            got = os.preadv(fd, [view[done:]], offset + done)
            if not got:
                raise OSError(f"the file ended at byte {offset + done}, "
                              f"{len(buffer) - done} short")
            done += got


RELEASE: Final = 4 << 20
"""How much of a blob's mapping a fetch's verification holds at most before dropping it:
four blobs at once hold 16 MiB of the file's pages (32 MiB steps held 70-100 MiB), and
4 MiB of madvise steps costs nothing measurable against 32 MiB ones (bench/README.md)."""


class MappedHash:
    """Feeds ranges of a mapped file to a hasher, in the order asked, without copying them;
    the hashed pages are dropped from the mapping every *release* bytes (the page cache
    keeps them), so what the process holds of the file stays under *release* plus a CHUNK."""

    def __init__(self, region: mmap.mmap, hasher: Hasher, *, release: int = RELEASE) -> None:
        self._region = region
        self._hasher = hasher
        self._release = release
        self._released = 0

    def __call__(self, start: int, end: int) -> None:
        with memoryview(self._region) as view:
            for offset in range(start, end, CHUNK):
                with view[offset:min(offset + CHUNK, end)] as piece:
                    self._hasher.update(piece)
                done = min(offset + CHUNK, end)
                if done - self._released >= self._release or done == len(self._region):
                    self._region.madvise(mmap.MADV_DONTNEED, self._released,
                                         done - self._released)
                    self._released = done - done % mmap.PAGESIZE


class InOrderHash:
    """A hash of a file whose parts land in any order, fed its bytes in file order.

    A part's thread tells `landed` of each piece it writes; while every byte before the
    piece is hashed (the part is at the frontier), that thread hashes the piece at once,
    while it is still in the CPU's cache. `upto(end)`, called in file order once each part
    is whole, hashes whatever the frontier has not reached yet (parts that landed ahead of
    it, read from the page cache): that alone makes the hash whole, the rest only makes it
    cheaper. One lock: a thread that finds it taken leaves its piece to whoever holds it or
    to `upto`. *feed(start, end)* hashes a range (`MappedHash`)."""

    def __init__(self, feed: Callable[[int, int], None]) -> None:
        self._feed = feed
        self._lock = threading.Lock()
        self.frontier = 0
        """Bytes [0, frontier) are hashed."""

    def landed(self, part_start: int, end: int) -> None:
        """Bytes [part_start, end) of the file are written."""
        if not part_start <= self.frontier < end or not self._lock.acquire(blocking=False):
            return
        try:
            if part_start <= self.frontier < end:  # checked again, now that it is ours
                self._feed(self.frontier, end)
                self.frontier = end
        finally:
            self._lock.release()

    def upto(self, end: int) -> None:
        """Hash up to *end*; every byte before it is written."""
        with self._lock:
            if self.frontier < end:
                self._feed(self.frontier, end)
                self.frontier = end


class PartBuffers:
    """Part-sized buffers reused by the uploads in flight, and freed once none is.

    A 64 MiB `bytes` per part is a fresh mapping each time (malloc maps anything over
    32 MiB), and faulting in and zeroing its pages cost 1.3 CPU-s per GiB read where reading
    into a reused buffer cost 0.25 (bench/README.md, upload). A buffer is lent to one part
    at a time; when the last borrower gives its buffer back the pool is emptied, so an idle
    store holds no part memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[bytearray] = []
        self._lent = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lend(self, size: int) -> Iterator[bytearray]:
        """A buffer of exactly *size* bytes (a pooled one when *size* is the pool's)."""
        pooled = size == self.size
        with self._lock:
            self._lent += 1
            buffer = self._free.pop() if pooled and self._free else None
        try:
            if buffer is None:
                buffer = bytearray(size)
            yield buffer
        finally:
            with self._lock:
                self._lent -= 1
                if not self._lent:
                    self._free.clear()
                elif pooled and buffer is not None:
                    self._free.append(buffer)


def read_ranges(
    ranges: list[tuple[int, int]],
    fetch: Callable[[int, int], None],
    consume: Callable[[int, int], None],
    *,
    pool: Executor,
    window: int,
) -> None:
    """Run `fetch(start, end)` for every range on *pool*, with at most *window* of this
    call's ranges queued or running at once, and call `consume(start, end)` on this thread
    for each range in order, once its fetch has returned.

    The first failure cancels what has not started and is raised once this call's running
    fetches end, so none of them is still writing when this returns or raises."""
    todo = iter(ranges)
    pending: deque[tuple[tuple[int, int], Future[None]]] = deque()
    try:
        # islice, not zip with a range: zip would draw one more range than it keeps,
        # and that part would never be fetched
        for byte_range in itertools.islice(todo, max(1, window)):
            pending.append((byte_range, pool.submit(fetch, *byte_range)))
        while pending:
            byte_range, future = pending.popleft()
            future.result()
            following = next(todo, None)
            if following is not None:
                pending.append((following, pool.submit(fetch, *following)))
            consume(*byte_range)
    except BaseException:
        for _, future in pending:
            future.cancel()
        wait([future for _, future in pending])
        raise
