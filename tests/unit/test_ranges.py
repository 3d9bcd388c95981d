"""Parallel ranged reads: every byte lands, each range is consumed in order after its fetch,
whatever the part, window and thread counts; a failure leaves no fetch running."""

from __future__ import annotations

import itertools
import mmap
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import xxhash

from registry.store.ranges import (
    InOrderHash,
    MappedHash,
    PartBuffers,
    pwrite_all,
    read_exactly_into,
    read_ranges,
    split,
)


@pytest.mark.parametrize(("size", "part", "threads", "window"), [
    (0, 4, 2, 2), (1, 4, 2, 2), (64, 4, 2, 4), (64, 4, 1, 1), (1000, 7, 3, 3),
    (4096, 16, 16, 16), (333, 1, 4, 8), (100, 3, 2, 0),
])
def test_every_part_is_fetched_written_and_consumed_in_order(
    tmp_path: Path, size: int, part: int, threads: int, window: int
) -> None:
    data = os.urandom(size)
    ranges = split(0, size, part)
    fetched: set[tuple[int, int]] = set()
    consumed: list[bytes] = []
    path = tmp_path / "out"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)

    def fetch(start: int, end: int) -> None:
        pwrite_all(fd, data[start:end], start)
        fetched.add((start, end))

    def consume(start: int, end: int) -> None:
        assert (start, end) in fetched  # never before its fetch returned
        consumed.append(os.pread(fd, end - start, start))

    try:
        with ThreadPoolExecutor(threads) as pool:
            read_ranges(ranges, fetch, consume, pool=pool, window=window)
    finally:
        os.close(fd)
    assert b"".join(consumed) == data
    assert path.read_bytes() == data


def test_a_failed_fetch_is_raised_after_the_running_ones_end() -> None:
    ranges = split(0, 64, 4)
    started, release = threading.Event(), threading.Event()
    running: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def fetch(start: int, end: int) -> None:
        with lock:
            running.add((start, end))
        try:
            if start == 0:
                started.wait()
                raise OSError("connection reset")
            started.set()
            # Not synchronisation: it keeps these running past part 0's failure, so a
            # read_ranges that did not wait for them would be caught below.
            release.wait(timeout=0.2)
        finally:
            with lock:
                running.discard((start, end))

    with ThreadPoolExecutor(4) as pool, pytest.raises(OSError, match="reset"):
        read_ranges(ranges, fetch, lambda *_range: None, pool=pool, window=4)
    assert running == set()  # nothing of this call is still writing


def test_split_refuses_a_zero_part_size() -> None:
    with pytest.raises(ValueError, match="positive"):
        split(0, 10, 0)


def test_part_buffers_are_reused_while_uploads_are_in_flight_and_freed_after() -> None:
    pool = PartBuffers(8)
    with pool.lend(8) as first:
        with pool.lend(8) as second:
            assert second is not first  # one buffer per part in flight
        with pool.lend(8) as third:
            assert third is second  # given back while another part is in flight: reused
        with pool.lend(3) as short:  # a blob's last part: its own exact size, never pooled
            assert len(short) == 3
        with pool.lend(8) as fourth:
            assert fourth is second
    with pool.lend(8) as after:  # nothing in flight in between: the pool was emptied
        assert after is not first
        assert after is not second


def test_read_exactly_into_fills_the_buffer_or_says_the_file_is_short(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(10)))
    fd = os.open(path, os.O_RDONLY)
    try:
        buffer = bytearray(4)
        read_exactly_into(fd, 3, buffer)
        assert buffer == bytes([3, 4, 5, 6])
        with pytest.raises(OSError, match="ended at byte 10, 2 short"):
            read_exactly_into(fd, 8, buffer)
    finally:
        os.close(fd)


@pytest.mark.parametrize("release", [mmap.PAGESIZE, 3 * mmap.PAGESIZE, 1 << 30])
def test_mapped_hash_feeds_ranges_in_the_order_asked(tmp_path: Path, release: int) -> None:
    data = os.urandom(5 * mmap.PAGESIZE + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    with path.open("rb") as handle, \
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as region:
        hasher = xxhash.xxh3_128()
        feed = MappedHash(region, hasher, release=release)
        for start, end in split(0, len(data), 1000):
            feed(start, end)
    assert hasher.hexdigest() == xxhash.xxh3_128(data).hexdigest()


@pytest.mark.parametrize("seed", range(20))
def test_in_order_hash_is_whole_whatever_order_the_pieces_land_in(seed: int) -> None:
    """Pieces of parts land in any order between parts (in order within one, as a part's
    GET writes them); `upto` in file order after each part makes the hash whole, and no
    byte is fed twice or out of order."""
    rng = random.Random(seed)
    parts = split(0, 100, 17)
    fed: list[tuple[int, int]] = []
    hashed = InOrderHash(lambda start, end: fed.append((start, end)))
    pieces = {part: [(part[0], end) for end in sorted(
        {part[1], *rng.sample(range(part[0] + 1, part[1] + 1), 2)})] for part in parts}
    whole = iter(parts)  # read_ranges calls upto in file order, once each part is whole
    following = next(whole, None)
    while following is not None:
        landing = [part for part in parts if pieces[part]]
        if landing and rng.random() < 0.8:
            part = rng.choice(landing)
            hashed.landed(*pieces[part].pop(0))
        elif not pieces[following]:
            hashed.upto(following[1])
            following = next(whole, None)
    assert fed[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(fed))
    assert fed[-1][1] == 100
    assert all(start < end for start, end in fed)
