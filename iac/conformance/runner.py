"""Running the cases: one timeout per case, one result per case, a summary, text or JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from iac.conformance.peer import NoAnswer
from iac.conformance.target import Case, Failed, Outcome, Target
from iac.errors import IacError

#: Seconds each case may take, all its steps together (``--timeout``).
DEFAULT_TIMEOUT = 5.0


@dataclass(frozen=True)
class CaseResult:
    """One case's verdict: its id, section and the sentence it checks, what was expected and what
    was seen, and how long it took."""

    id: str
    section: str
    quote: str
    passed: bool
    expected: str
    seen: str
    seconds: float

    def line(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'} {self.id} (§{self.section})"
        if self.passed:
            return f"{head}: {self.seen}"
        return f'{head}\n  "{self.quote}"\n  expected: {self.expected}\n  seen:     {self.seen}'


@dataclass
class Report:
    """A run against one URL: its results in order, and whether anything IAC ever answered."""

    url: str
    role: str  # "server": the tester dialed; "client": the implementation dialed the tester
    results: list[CaseResult] = field(default_factory=list)
    reached: bool = False

    @property
    def failed(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]

    @property
    def exit_status(self) -> int:
        """0 every case passed, 1 a case failed, 2 nothing IAC ever answered."""
        if not self.reached:
            return 2
        return 1 if self.failed else 0

    def summary(self) -> str:
        n, bad = len(self.results), len(self.failed)
        tail = "" if self.reached else "; no IAC HELLO was ever seen (unreachable, or not an IAC node)"
        return f"{n - bad} passed, {bad} failed of {n} cases ({self.role} role, {self.url}){tail}"

    def text(self) -> str:
        return "\n".join([*(r.line() for r in self.results), self.summary()])

    def to_json(self) -> str:
        doc = {
            "url": self.url,
            "role": self.role,
            "reached": self.reached,
            "exit_status": self.exit_status,
            "passed": len(self.results) - len(self.failed),
            "failed": len(self.failed),
            "cases": [asdict(r) for r in self.results],
        }
        return json.dumps(doc, indent=2, ensure_ascii=False)


async def run_case(case: Case, target: Target) -> CaseResult:
    t0 = time.monotonic()
    target.case_deadline = t0 + target.timeout
    try:
        out = await asyncio.wait_for(case.run(target), target.timeout + 0.5)
    except (NoAnswer, TimeoutError):
        out = Outcome(False, "an answer", f"no answer in {target.timeout:g} s")
    except Failed as exc:
        out = Outcome(False, "the case to run", exc.seen)
    except (IacError, OSError) as exc:
        out = Outcome(False, "the case to run", f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(target.end_case(), 2.0)
    return CaseResult(
        case.id, case.section, case.quote, out.passed, out.expected, out.seen, round(time.monotonic() - t0, 3)
    )


async def run_server_suite(
    url: str,
    to: str,
    cases: Sequence[Case],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    on_result: Callable[[CaseResult], None] | None = None,
) -> Report:
    """Every case that applies to ``url``'s transport, one after the other, against the node at ``url``."""
    target = Target(url, to, timeout)
    report = Report(url, "server")
    try:
        for case in cases:
            if target.transport not in case.transports:
                continue
            result = await run_case(case, target)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        target.close()
    report.reached = target.reached
    return report


__all__ = ["DEFAULT_TIMEOUT", "CaseResult", "Report", "run_case", "run_server_suite"]
