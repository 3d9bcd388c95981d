"""Parallel ranged reads: every byte lands, in order, whatever the part and thread counts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.ranges import read_ranges_into, split


@pytest.mark.parametrize(("size", "part", "threads"), [
    (0, 4, 2), (1, 4, 2), (64, 4, 2), (64, 4, 1), (1000, 7, 3), (4096, 16, 16), (333, 1, 4),
])
def test_every_part_is_fetched_written_and_consumed_in_order(
    tmp_path: Path, size: int, part: int, threads: int
) -> None:
    data = os.urandom(size)
    ranges = split(0, size, part)
    consumed: list[bytes] = []
    path = tmp_path / "out"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        read_ranges_into(fd, ranges, lambda start, end: data[start:end], consumed.append,
                         threads=threads)
    finally:
        os.close(fd)
    assert b"".join(consumed) == data
    assert path.read_bytes() == data
