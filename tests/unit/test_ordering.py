"""tests/ordering.py: the waiting tests spread evenly among the working ones, nothing lost."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.ordering import spread_waiting


def waits(name: str) -> bool:
    return name.startswith("w")


def quick(name: str) -> bool:
    return name.startswith("u")  # tests/unit: last, milliseconds each


def test_nothing_waits_nothing_moves() -> None:
    items = ["s1", "s2", "u1"]
    assert spread_waiting(items, waits, quick) == items


def test_waiting_tests_side_by_side_are_spread_at_even_steps_before_the_quick_ones() -> None:
    items = ["w1", "w2", "w3", *(f"s{n}" for n in range(8)), "u1", "u2"]
    assert spread_waiting(items, waits, quick) == [
        "s0", "s1", "w1", "s2", "s3", "w2", "s4", "s5", "w3", "s6", "s7", "u1", "u2"]


def test_more_waiting_than_working_tests_go_first_in_order() -> None:
    items = ["s1", "w1", "w2", "w3", "u1"]
    assert spread_waiting(items, waits, quick) == ["w1", "w2", "w3", "s1", "u1"]


@given(st.lists(st.sampled_from(["w", "s"]), max_size=40), st.integers(0, 10))
def test_every_test_runs_once_and_no_waiting_one_is_left_among_the_quick(
        kinds: list[str], unit: int) -> None:
    items = [f"{kind}{n}" for n, kind in enumerate(kinds)] + [f"u{n}" for n in range(unit)]
    spread = spread_waiting(items, waits, quick)
    assert sorted(spread) == sorted(items)
    assert [i for i in spread if waits(i)] == [i for i in items if waits(i)]
    assert [i for i in spread if not waits(i)] == [i for i in items if not waits(i)]
    if unit:  # the quick tests, last in *items*, stay last
        assert spread[-unit:] == items[-unit:]
