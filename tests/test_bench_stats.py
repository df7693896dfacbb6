"""The benchmarks' one percentile rule (nearest rank) against a table worked out by hand, and the
same answers from ``iac ping``'s copy of it (the package does not import the benchmarks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iac.bench.harness.stats import median, percentile
from iac.cli.net import percentile as ping_percentile

ROOT = Path(__file__).resolve().parent.parent

ONE_TO_HUNDRED = [float(i) for i in range(100, 0, -1)]  # 100 .. 1: the order does not matter
FIVE = [50.0, 15.0, 40.0, 20.0, 35.0]  # sorted: 15 20 35 40 50
TEN = [3.0, 6.0, 7.0, 8.0, 8.0, 10.0, 13.0, 15.0, 16.0, 20.0]

#: (values, p, the ceil(p / 100 * n)-th smallest value)
TABLE = [
    (ONE_TO_HUNDRED, 0, 1.0),  # p = 0: the smallest
    (ONE_TO_HUNDRED, 1, 1.0),
    (ONE_TO_HUNDRED, 50, 50.0),  # rank 50 exactly: not 51
    (ONE_TO_HUNDRED, 50.5, 51.0),  # rank 50.5 -> 51
    (ONE_TO_HUNDRED, 99, 99.0),  # rank 99 exactly: not 100
    (ONE_TO_HUNDRED, 99.5, 100.0),
    (ONE_TO_HUNDRED, 100, 100.0),
    (FIVE, 5, 15.0),  # rank 0.25 -> 1
    (FIVE, 30, 20.0),  # rank 1.5 -> 2
    (FIVE, 40, 20.0),  # rank 2 exactly
    (FIVE, 50, 35.0),  # rank 2.5 -> 3
    (FIVE, 100, 50.0),
    (TEN, 25, 7.0),  # rank 2.5 -> 3
    (TEN, 50, 8.0),  # rank 5
    (TEN, 75, 15.0),  # rank 7.5 -> 8
    (TEN, 90, 16.0),  # rank 9
    (TEN, 99, 20.0),  # rank 9.9 -> 10
    ([7.0], 0, 7.0),
    ([7.0], 99, 7.0),
    ([2.0, 1.0], 50, 1.0),  # rank 1
    ([2.0, 1.0], 51, 2.0),  # rank 1.02 -> 2
]


@pytest.mark.parametrize(("values", "p", "expected"), TABLE)
def test_percentile_is_the_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


@pytest.mark.parametrize(("values", "p", "expected"), TABLE)
def test_iac_ping_agrees_with_the_benchmarks(values: list[float], p: float, expected: float) -> None:
    assert ping_percentile(values, p) == expected


def test_percentile_refuses_no_values_and_p_outside_0_to_100() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    for p in (-1, 100.5):
        with pytest.raises(ValueError):
            percentile([1.0], p)


def test_median_is_the_middle_or_the_mean_of_the_two_middle_values() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5
