"""A standalone scenario's report on the console: the tables ``RESULTS.md`` shows for a recorded
run, rendered from this run's own output (``print_rendered``)."""

from __future__ import annotations

import datetime as dt
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from iac.bench.harness.environment import environment
from iac.bench.harness.paths import ROOT
from iac.bench.harness.results import Result
from iac.bench.reports.figures_results import RECORD_SCHEMA, Results, Sheet
from iac.bench.reports.figures_tables import RENDERERS

Doc = dict[str, Any]
Names = Sequence[str]
Fill = Callable[[Result, Any], None]


def print_rendered(sections: Sequence[str], module: str, result: Doc, suite: bool = False) -> None:
    """Print the marked sections ``sections`` of ``result``, the output of ``python -m module``
    (``suite``: shaped as the suite's results, with ``scenarios``)."""
    doc: dict[str, Any] = {
        "command": shlex.join(["python", "-m", module, *sys.argv[1:]]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        **(result if suite else {"schema": RECORD_SCHEMA, "result": result}),
    }
    res = Results("(not recorded)", doc)
    print(f"`{doc['command']}` started {doc['started']} (not recorded)")
    for name in sections:
        try:
            lines = RENDERERS[name](Sheet(), ROOT / "RESULTS.md", [res])
        except KeyError as exc:  # a run of only some contenders
            lines = [f"({name}: not shown, this run has no {exc})"]
        print("\n".join(x for x in lines if not x.startswith("*Source: ")))


def print_rows(module: str, parts: Sequence[tuple[str, Fill, Any]], sections: Names = ()) -> None:
    """Print the output of ``python -m module`` as the suite's tables: for each ``(scenario, fill,
    data)`` of ``parts``, the rows ``fill(result, data)`` adds; ``sections`` (default: the
    scenarios' own tables) are rendered from them."""
    results = []
    for name, fill, data in parts:
        res = Result(name, name)
        fill(res, data)
        res.finish()
        results.append(res.to_json())
    print_rendered(sections or ("suite-scenarios",), module, {"scenarios": results}, suite=True)
