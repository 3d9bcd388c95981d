"""The order in which pytest-xdist hands tests out: the tests that mostly wait (on a stand-in
server's per-token delays, on lease time-outs) spread evenly among those that use the CPU.

Next to each other they ran on all four workers at once and left the two cores idle (~25 % for
two minutes); spread, each waits beside tests that work (idle after set-up: 71-80 CPU-s in a
run before, 54 after). tests/conftest.py applies it to the collected items.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def spread_waiting(items: Sequence[T], waits: Callable[[T], bool],
                   quick: Callable[[T], bool]) -> list[T]:
    """*items* in their order, except that those that *waits* are placed at even steps among
    the others that are not *quick* (tests/unit, last and milliseconds each: spread among them
    too, the last waiting tests would again run side by side at the end)."""
    waiting = [item for item in items if waits(item)]
    rest = [item for item in items if not waits(item)]
    if not waiting:
        return rest
    slow = sum(1 for item in rest if not quick(item))
    step = slow / (len(waiting) + 1)
    before: dict[int, list[T]] = {}  # by the index in *rest* each goes before
    for number, item in enumerate(waiting, start=1):
        before.setdefault(int(number * step), []).append(item)
    spread: list[T] = []
    for index, item in enumerate(rest):
        spread.extend(before.pop(index, []))
        spread.append(item)
    for left in before.values():
        spread.extend(left)
    return spread
