"""Every conformance case cites a section of docs/PROTOCOL.md and quotes the sentence it checks: the
section must exist and hold the quote, so that a case stays true when the document changes.

A quote may join several passages: ``…`` (or ``; ``) separates pieces of one section, and a piece that
starts with ``(N)`` or ``(N Title)`` is quoted from section N. Table rows are compared with their
cell bars as spaces, and whitespace is flattened everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from iac.conformance import all_cases
from iac.conformance.listen import ALL_CLIENT_CASES
from iac.conformance.vectors import live_accepts, live_negatives

ROOT = Path(__file__).resolve().parent.parent
_SECTION = re.compile(r"^## (\d+)\. (.*)$", re.M)
_MARK = re.compile(r"^\((\d+)(?: ([^)]*))?\)\s+")


def _flat(text: str) -> str:
    return " ".join(text.replace("|", " ").split())


def _sections() -> dict[str, str]:
    text = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    heads = list(_SECTION.finditer(text))
    return {
        m.group(1): text[m.start() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        for i, m in enumerate(heads)
    }


SECTIONS = _sections()


def _cited() -> list[tuple[str, str, str]]:
    """Every case the tester runs, in both roles (``all_cases`` includes the vector cases)."""
    out = {c.id: (c.section, c.quote) for c in all_cases()}
    out |= ALL_CLIENT_CASES
    vector_ids = {f"vector.{v.name}" for v in live_negatives()} | {f"accept.{v.name}" for v in live_accepts()}
    assert vector_ids <= set(out), "every live vector is a case"
    return [(k, s, q) for k, (s, q) in out.items()]


def _pieces(section: str, quote: str) -> list[tuple[str, str]]:
    """``(section number, passage)`` for each passage the quote joins."""
    out: list[tuple[str, str]] = []
    current = section.split()[0]
    for sentence in re.split(r"(?<=\.)\s+(?=\()", quote):
        m = _MARK.match(sentence)
        if m:
            current, sentence = m.group(1), sentence[m.end() :]
        for piece in re.split(r"…|; ", sentence):
            piece = piece.strip(" .")
            if piece:
                out.append((current, piece))
    return out


CITED = _cited()


def test_the_cases_are_all_collected() -> None:
    assert len(CITED) > 100


@pytest.mark.parametrize(("case_id", "section", "quote"), CITED, ids=[i for i, _, _ in CITED])
def test_a_case_quotes_its_section(case_id: str, section: str, quote: str) -> None:
    number, _, title = section.partition(" ")
    assert number in SECTIONS, f"{case_id}: no section {number} in docs/PROTOCOL.md"
    head = SECTIONS[number].splitlines()[0]
    assert title in SECTIONS[number], f"{case_id}: {title!r} is not in section {number} ({head})"
    for sec, piece in _pieces(section, quote):
        assert sec in SECTIONS, f"{case_id}: no section {sec}"
        assert _flat(piece) in _flat(SECTIONS[sec]), f"{case_id}: section {sec} does not say {piece!r}"
