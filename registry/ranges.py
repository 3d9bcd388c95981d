"""Parallel ranged reads into one file, consumed in order: the engine of a fast, verified fetch.

Worker threads fetch byte ranges and write each at its offset; the calling thread receives the
parts in file order as they complete (to hash them), so verification overlaps the transfer.
At most two parts per thread are in flight or waiting, which bounds memory.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


def split(start: int, end: int, part_size: int) -> list[tuple[int, int]]:
    """[start, end) cut into consecutive `(start, end)` parts of *part_size* (the last shorter)."""
    if part_size <= 0:
        raise ValueError(f"part size must be positive, got {part_size}")
    return [(offset, min(offset + part_size, end)) for offset in range(start, end, part_size)]


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def read_ranges_into(
    fd: int,
    ranges: list[tuple[int, int]],
    fetch: Callable[[int, int], bytes],
    consume: Callable[[bytes], None],
    *,
    threads: int,
) -> None:
    """Fetch every range with `fetch(start, end)` on *threads* threads, write it to *fd* at
    its offset, and call *consume* with the parts in order, on this thread.

    The first failure cancels what has not started and is raised once running fetches end,
    so nothing writes to *fd* after this returns or raises."""
    if not ranges:
        return
    threads = max(1, min(threads, len(ranges)))

    def work(byte_range: tuple[int, int]) -> bytes:
        data = fetch(*byte_range)
        pwrite_all(fd, data, byte_range[0])
        return data

    todo = iter(ranges)
    with ThreadPoolExecutor(threads, thread_name_prefix="ranged-read") as pool:
        pending: deque[Future[bytes]] = deque()
        try:
            # islice, not zip with a range: zip would draw one more range than it keeps,
            # and that part would never be fetched
            for byte_range in itertools.islice(todo, 2 * threads):
                pending.append(pool.submit(work, byte_range))
            while pending:
                data = pending.popleft().result()
                following = next(todo, None)
                if following is not None:
                    pending.append(pool.submit(work, following))
                consume(data)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
