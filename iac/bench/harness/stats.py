"""The statistics the benchmark scripts report, each computed one way.

* :func:`percentile` is the nearest-rank percentile: for ``n`` values and ``p`` in [0, 100], the
  ``ceil(p / 100 * n)``-th smallest value (the smallest for ``p`` = 0), that is the least value that
  at least ``p`` % of the values are less than or equal to. It never interpolates: every figure is
  a measured sample. ``iac ping`` computes its percentiles the same way
  (``iac.cli.net.percentile``; the package does not import the benchmarks).
* :func:`median` is :func:`statistics.median`: the middle value, or the mean of the two middle
  values for an even count.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (in any order), ``p`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p!r}")
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), the 1-based rank
    return ordered[int(rank) - 1]


__all__ = ["median", "percentile"]
