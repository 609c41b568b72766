"""The tool.record budgets of families of runs, with a clock of the test's own."""

from __future__ import annotations

from stockade.daemon._tools import RecordBudgets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_holds_back_a_burst_and_refills() -> None:
    clock = Clock()
    budgets = RecordBudgets(rate=10.0, burst=5, total=10**9, clock=clock)
    assert [budgets.charge("r-a", 1) for _ in range(5)] == [None] * 5
    why = budgets.charge("r-a", 1)
    assert why is not None and "faster than 10 a second (a burst of 5)" in why
    assert budgets.charge("r-b", 1) is None, "another family was held back"
    clock.now += 0.25  # two calls' worth and a half
    assert [budgets.charge("r-a", 1) is None for _ in range(3)] == [True, True, False]


def test_the_bytes_are_a_total_over_the_familys_life() -> None:
    budgets = RecordBudgets(rate=1e9, burst=10**6, total=100, clock=Clock())
    assert budgets.charge("r-a", 60) is None
    why = budgets.charge("r-a", 50)
    assert why is not None and "stored 60 bytes" in why and "budget of 100" in why
    assert budgets.charge("r-a", 40) is None  # a refused call took nothing
    assert budgets.charge("r-a", 1) is not None


def test_only_the_first_refusal_is_to_be_recorded_and_all_are_counted() -> None:
    budgets = RecordBudgets(clock=Clock())
    assert [budgets.refuse("r-a") for _ in range(3)] == [True, False, False]
    assert budgets.refuse("r-b") is True
    assert budgets.refused() == {"r-a": 3, "r-b": 1}
