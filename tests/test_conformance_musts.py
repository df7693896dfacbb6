"""Every MUST of docs/PROTOCOL.md carries a conformance case, or the mark "not observable on the
wire" with a reason (docs/IMPLEMENTING.md, "Every MUST, and what checks it")."""

from __future__ import annotations

import re
from pathlib import Path

from iac.conformance import all_cases
from iac.conformance.listen import CLIENT_CASES

ROOT = Path(__file__).resolve().parent.parent
NOT_OBSERVABLE = "not observable on the wire: "
NO_CASE_YET = "no case yet: "
#: Rows that name the case they still need; the number may only go down.
MAX_NO_CASE_YET = 20


def _flat(text: str) -> str:
    return " ".join(text.split())


def must_sentences() -> list[tuple[str, str]]:
    """``(section, sentence)`` for every sentence of sections 2 and above with MUST in it."""
    section, out, para = "", [], []
    paras: list[tuple[str, str]] = []
    for line in (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].split(".")[0]
        starts_item = re.match(r"\s*([-*]|\d+\.)\s", line) is not None
        if not line.strip() or line.startswith("#") or line.startswith("|") or starts_item:
            if para:
                paras.append((section, " ".join(para)))
                para = []
            if line.startswith("|"):
                paras.append((section, line))
                continue
            if not line.strip() or line.startswith("#"):
                continue
        para.append(line.strip())
    if para:
        paras.append((section, " ".join(para)))
    for sec, p in paras:
        if sec in ("", "1") or not sec.isdigit():
            continue
        for s in re.split(r"(?<=[.:;])\s+(?=[A-Z`*(])", p):
            if re.search(r"\bMUST\b", s):
                out.append((sec, _flat(s)))
    return out


def rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "IMPLEMENTING.md").read_text(encoding="utf-8")
    table = text.split("## Every MUST, and what checks it", 1)[1]
    found = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            found.append((cells[0], _flat(cells[1]), cells[2]))
    return found


def test_every_must_has_a_row_and_every_row_a_must() -> None:
    sentences, table = must_sentences(), rows()
    assert len(sentences) > 60 and table
    missing = [f"§{sec}: {s[:120]}" for sec, s in sentences if not any(p in s for _, p, _ in table)]
    assert not missing, "MUSTs without a row in docs/IMPLEMENTING.md:\n" + "\n".join(missing)
    stale = [p for _, p, _ in table if not any(p in s for _, s in sentences)]
    assert not stale, f"rows that match no MUST of docs/PROTOCOL.md: {stale}"


def test_every_row_names_real_cases_or_says_why_not() -> None:
    ids = {c.id for c in all_cases()} | set(CLIENT_CASES)
    waiting = 0
    for sec, phrase, mark in rows():
        if mark.startswith(NOT_OBSERVABLE) or mark.startswith(NO_CASE_YET):
            reason = mark.split(": ", 1)[1]
            assert len(reason) > 10, (sec, phrase, mark)
            waiting += mark.startswith(NO_CASE_YET)
            continue
        named = re.findall(r"`([a-z0-9_.]+)`", mark)
        assert named, f"§{sec} {phrase!r}: neither a case id nor a mark: {mark!r}"
        unknown = [n for n in named if n not in ids]
        assert not unknown, f"§{sec} {phrase!r}: no such case {unknown}"
    assert waiting <= MAX_NO_CASE_YET, f"{waiting} rows wait for a case (at most {MAX_NO_CASE_YET})"
