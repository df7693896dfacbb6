"""The statistics the benchmark scripts report, each computed one way (benchmarks/README.md,
"Percentiles"): :func:`percentile` by nearest rank, never interpolating (as ``iac ping``), and
:func:`median`, :func:`statistics.median`."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (in any order), ``p`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p!r}")
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), the 1-based rank
    return ordered[int(rank) - 1]


def median_of(d: dict[str, Any] | None, key: str) -> float | None:
    """``d[key]`` as a number: the median of a summary, the figure itself, or None when absent."""
    v = None if d is None else d.get(key)
    if isinstance(v, dict):
        return float(v["median"])
    return float(v) if isinstance(v, int | float) else None


__all__ = ["median", "median_of", "percentile"]
