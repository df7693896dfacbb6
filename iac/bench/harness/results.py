"""The suite's results: per-round statistics, the turns contenders take, one scenario's :class:`Result`
and the :class:`Context` a scenario runs in. The JSON schema is documented in
``benchmarks/README.md`` (section "Suite").
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from iac.bench.harness.paths import module_argv
from iac.bench.harness.stats import median

T = TypeVar("T")
SCHEMA = "iac-bench/1"
MAX_SAMPLES = 2000  # latency samples kept per contender in the JSON (for the CDF plot)


# --- statistics and interleaving (pure) ---------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """``{"median", "min", "max", "n"}`` of per-round figures."""
    if not values:
        raise ValueError("no values to summarize")
    return {
        "median": float(median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "n": len(values),
    }


def turn_order(names: Sequence[T], rounds: int) -> list[list[T]]:
    """Contenders' turns per round: forward on even rounds, reversed on odd ones (A B B A …),
    so that no contender always runs first or right after the same neighbour."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


async def interleave_async(
    steps: dict[str, Callable[[], Awaitable[float]]],
    rounds: int,
    warmup: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Run every step ``warmup`` times (results discarded), then ``rounds`` rounds in
    :func:`turn_order`; returns each step's per-round figures. The steps share one event loop
    (nodes that live across rounds)."""
    for _ in range(warmup):
        for fn in steps.values():
            await fn()
    out: dict[str, list[float]] = {name: [] for name in steps}
    for r, order in enumerate(turn_order(list(steps), rounds)):
        if on_round is not None:
            on_round(r)
        for name in order:
            out[name].append(await steps[name]())
    return out


def interleave(
    steps: dict[str, Callable[[], float]],
    rounds: int,
    warmup: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """:func:`interleave_async` for plain functions (on an event loop of its own)."""

    def step(fn: Callable[[], float]) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            return fn()

        return run

    return asyncio.run(interleave_async({k: step(fn) for k, fn in steps.items()}, rounds, warmup, on_round))


async def at_depth(call: Callable[[int], Awaitable[object]], n: int, depth: int) -> float:
    """``call(0)`` … ``call(n - 1)`` with ``depth`` outstanding (workers sharing one counter); the
    elapsed seconds."""
    ids = iter(range(n))

    async def worker() -> None:
        for i in ids:
            await call(i)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(depth)))
    return time.perf_counter() - t


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def downsample(samples: Sequence[float], limit: int = MAX_SAMPLES) -> list[float]:
    """At most ``limit`` evenly spaced order statistics (enough for a CDF)."""
    s = sorted(samples)
    if len(s) <= limit:
        return s
    step = (len(s) - 1) / (limit - 1)
    return [s[round(i * step)] for i in range(limit)]


# --- results ------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one scenario produced (see the schema in benchmarks/README.md)."""

    name: str  # the fields in the order results.json has them
    title: str
    status: str = "ok"  # ok | skipped | unavailable | error
    reason: str | None = None
    baseline: str | None = None
    duration_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    raw: Any = None
    #: Contenders that could not run here: label -> ``<what is missing> — <the command that adds it>``.
    skipped: dict[str, str] = field(default_factory=dict)

    def add(
        self,
        contender: str,
        metric: str,
        unit: str,
        values: Sequence[float] | dict[str, Any],
        *,
        better: str = "lower",
        baseline: str | None = None,
        iac: bool | None = None,
        secures: str | None = None,
    ) -> None:
        """One figure: per-round ``values`` (or an already summarized dict); ``secures`` says what
        the contender protects (encryption, per-message authentication)."""
        stats = dict(values) if isinstance(values, dict) else summarize(values)
        stats.setdefault("n", 1)
        self.rows.append(
            {
                "contender": contender,
                "metric": metric,
                "unit": unit,
                "better": better,
                **{k: stats[k] for k in ("median", "min", "max", "n")},
                "baseline": baseline,
                "iac": contender.startswith("IAC") if iac is None else iac,
                "ratio": None,
                **({"secures": secures} if secures else {}),
            }
        )

    def finish(self) -> None:
        """Fill each IAC row's ratio to its baseline's row of the same metric."""
        index = {(r["contender"], r["metric"]): r for r in self.rows}
        for row in self.rows:
            base_name = row["baseline"] or self.baseline
            row["baseline"] = base_name
            if not row["iac"] or base_name is None or base_name == row["contender"]:
                row["ratio"] = None
                continue
            base = index.get((base_name, row["metric"]))
            row["ratio"] = ratio(row["median"], base["median"]) if base else None

    def to_json(self) -> dict[str, Any]:
        """The scenario's entry in results.json (``skipped`` only when a contender was)."""
        out = {**asdict(self), "duration_s": round(self.duration_s, 3)}
        return out if self.skipped else {k: v for k, v in out.items() if k != "skipped"}


@dataclass
class Context:
    quick: bool
    tmp: Path
    progress: Callable[[str], None]
    cache: dict[str, Any] = field(default_factory=dict)
    backends: list[str] = field(default_factory=list)


def run_script(ctx: Context, script: str, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` with ``--json`` and return what it wrote."""
    out = ctx.tmp / f"{script}-{len(ctx.cache)}-{time.monotonic_ns()}.json"
    argv = module_argv(f"iac.bench.scenarios.{script.removesuffix('.py')}", *args, "--json", str(out))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0 or not out.exists():
        tail = (res.stderr or res.stdout).strip()[-1500:]
        raise RuntimeError(f"{script} {' '.join(args)} failed ({res.returncode}): {tail}")
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data
