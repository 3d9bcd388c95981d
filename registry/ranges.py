"""Parallel ranged reads into one file, checked in order: the engine of a fast, verified fetch.

Each range is fetched on a shared pool and streamed straight to its offset in the file; the
calling thread is told about the ranges in file order as they complete (to hash them from
the file), so verification overlaps the transfer. No part is held in memory: what one fetch
costs is the pool's threads and their stream buffers, however large the blobs.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait


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


def read_exactly(fd: int, offset: int, size: int) -> bytes:
    """*size* bytes of *fd* from *offset*; OSError when the file ends first."""
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            raise OSError(f"the file ended at byte {offset + done}, {size - done} short")
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


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
