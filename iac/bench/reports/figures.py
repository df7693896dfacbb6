"""Render the benchmark figures of README.md (its headline) and benchmarks/RESULTS.md from
benchmarks/results/: ``python -m iac.bench.reports.figures [--check | --latest]``.

A marked section is ``<!-- figures: NAME (results file, …) -->`` … ``<!-- /figures -->``, what
``RENDERERS[NAME]`` renders from those files (benchmarks/README.md, "Refreshing the figures").
The check fails on a stale section, and when two sections show one figure of a command's results
(a key inside its file's *family*: the file name without the date) differently.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from iac.bench.harness.paths import ROOT
from iac.bench.reports.figures_results import DATED, Sheet, latest, load
from iac.bench.reports.figures_tables import RENDERERS

DOCUMENTS = (ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md")
MARKER = re.compile(r"<!-- figures: ([\w-]+) \(([^)]*)\) -->\n(.*?)<!-- /figures -->", re.DOTALL)


@dataclass
class Section:
    """One marked section: where it is, what it names, what it holds and what it should hold."""

    document: Path
    line: int
    name: str
    sources: list[str]
    body: str
    rendered: str = ""
    sheet: Sheet = field(default_factory=Sheet)
    error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line} ({self.name})"

    @property
    def stale(self) -> bool:
        return self.error is None and self.body != self.rendered


def split_sources(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def sections(documents: Sequence[Path] = DOCUMENTS) -> list[Section]:
    """Every marked section of ``documents``, rendered, or with the reason it cannot be."""
    out = []
    for document in documents:
        text = document.read_text(encoding="utf-8")
        for m in MARKER.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            sec = Section(document, line, m.group(1), split_sources(m.group(2)), m.group(3))
            missing = [s for s in sec.sources if not (ROOT / s).is_file()]
            if sec.name not in RENDERERS:
                sec.error = f"no renderer named {sec.name!r}"
            elif missing or not sec.sources:
                sec.error = f"results file missing: {', '.join(missing) or '(none named)'}"
            else:
                lines = RENDERERS[sec.name](sec.sheet, document, [load(s) for s in sec.sources])
                sec.rendered = "\n".join(lines) + "\n"
            out.append(sec)
    return out


def conflicts(secs: Sequence[Section]) -> list[str]:
    """Figures shown differently by two sections (or twice by one)."""
    seen: dict[str, tuple[str, Section]] = {}
    out = []
    for sec in secs:
        out += [f"{sec.where}: shown two ways: {c}" for c in sec.sheet.clashes]
        for key, text in sec.sheet.values.items():
            first, where = seen.setdefault(key, (text, sec))
            if first != text:
                out.append(f"{key} is {first!r} in {where.where} but {text!r} in {sec.where}")
    return out


def problems(secs: Sequence[Section]) -> list[str]:
    """What ``--check`` fails on: sections that cannot be rendered, stale ones, conflicting figures."""
    out = [f"{s.where}: {s.error}" for s in secs if s.error]
    out += [f"{s.where}: stale (run python -m iac.bench.reports.figures)" for s in secs if s.stale]
    return out + conflicts(secs)


def write(secs: Sequence[Section]) -> list[Path]:
    """Rewrite the stale sections in place; the documents changed."""
    changed = []
    for document in dict.fromkeys(s.document for s in secs):
        fresh = {s.line: s for s in secs if s.document == document and s.error is None}
        text = document.read_text(encoding="utf-8")

        def sub(m: re.Match[str], text: str = text, fresh: dict[int, Section] = fresh) -> str:
            sec = fresh.get(text.count("\n", 0, m.start()) + 1)
            if sec is None:
                return m.group(0)
            return m.group(0)[: m.start(3) - m.start(0)] + sec.rendered + "<!-- /figures -->"

        new = MARKER.sub(sub, text)
        if new != text:
            document.write_text(new, encoding="utf-8")
            changed.append(document)
    return changed


def retarget(documents: Sequence[Path] = DOCUMENTS) -> None:
    """Point every marker at the newest results file of the same family."""
    for document in documents:

        def sub(m: re.Match[str]) -> str:
            paths = []
            for s in split_sources(m.group(2)):
                dm = DATED.match(Path(s).name)
                paths.append((latest(dm.group(2)) if dm else None) or s)
            return f"<!-- figures: {m.group(1)} ({', '.join(paths)}) -->\n{m.group(3)}<!-- /figures -->"

        text = document.read_text(encoding="utf-8")
        new = MARKER.sub(sub, text)
        if new != text:
            document.write_text(new, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when a marked section is stale")
    ap.add_argument("--latest", action="store_true", help="use the newest results file of each command")
    args = ap.parse_args(argv)
    if args.latest and args.check:
        ap.error("--latest rewrites the documents; --check only reads them")
    if args.latest:
        retarget()
    if not args.check:
        for path in write(sections()):
            print(f"rewrote {path.relative_to(ROOT)}", file=sys.stderr)
    found = problems(sections())
    for p in found:
        print(p, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
