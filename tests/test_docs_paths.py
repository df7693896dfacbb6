"""Every module, name and file the documents point at exists.

The documents are docs/**/*.md, README.md, CHANGELOG.md and benchmarks/README.md. A dotted name
that starts with ``iac.`` or ``tools.`` must import (the longest importable prefix, then
attributes: a class, a function, a method, an enum member); a path that starts with ``iac/``, ``tools/`` or
``benchmarks/`` must be a file or a folder of the repository. Sections rendered from results files
(between ``<!-- figures: … -->`` and ``<!-- /figures -->``) quote the commands as they were run, which
may name files since moved; tests/test_figures.py checks those sections.
"""

from __future__ import annotations

import functools
import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted(
    [
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "benchmarks" / "README.md",
    ]
)

#: ``iac.Name`` or ``tools.module.name``; not inside a path or a longer dotted word
#: (``proto/iac.proto`` is a file, checked as a path when it is written as one).
DOTTED = re.compile(r"(?<![\w./-])(?:iac|tools)(?:\.[A-Za-z_]\w*)+")
#: ``iac/…``, ``tools/…`` or ``benchmarks/…`` up to the first character a path here does not use.
PATH = re.compile(r"(?<![\w./-])(?:iac|tools|benchmarks)/[\w./-]*")
#: Written like a path, but not one: the ALPN protocol identifier, MCP method names.
NOT_PATHS = {"iac/1", "tools/list", "tools/call"}
#: A section rendered from a results file (benchmarks/README.md, "Figures").
RENDERED = re.compile(r"<!-- figures: [\w-]+ \([^)]*\) -->\n.*?<!-- /figures -->", re.DOTALL)


def _mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for doc in DOCUMENTS:
        for match in pattern.finditer(RENDERED.sub("", doc.read_text(encoding="utf-8"))):
            found.add((doc.relative_to(ROOT).as_posix(), match.group().rstrip(".")))
    return sorted(found)


@functools.cache
def _proto_types() -> frozenset[str]:
    """The messages and enums of the wire schema: ``iac.Message`` in a document is the protobuf
    type (package ``iac``), whether or not Python exports a class of that name at the top."""
    text = (ROOT / "proto" / "iac.proto").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^(?:message|enum) (\w+)", text, re.MULTILINE))


def _resolves(name: str) -> bool:
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "iac" and parts[1] in _proto_types():
        return True
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@functools.cache
def _tracked() -> frozenset[str]:
    """The files git tracks (empty outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(out.decode().split("\0")) - {""}


def _exists(path: str) -> bool:
    """A tracked file or a folder holding one; or a file on disk (new, not committed yet). An
    empty folder left behind on disk does not count."""
    target = ROOT / path
    if target.is_file():
        return True
    prefix = path.rstrip("/") + "/"
    if any(f.startswith(prefix) for f in _tracked()):
        return True
    return target.is_dir() and any(p.is_file() and "__pycache__" not in p.parts for p in target.rglob("*"))


def test_the_documents_name_modules_and_paths() -> None:
    assert len(_mentions(DOTTED)) > 20 and len(_mentions(PATH)) > 10  # the patterns find them


@pytest.mark.parametrize(("doc", "name"), _mentions(DOTTED))
def test_a_dotted_name_in_the_documents_imports(doc: str, name: str) -> None:
    assert _resolves(name), f"{doc} names {name}, which does not import"


@pytest.mark.parametrize(("doc", "path"), [m for m in _mentions(PATH) if m[1] not in NOT_PATHS])
def test_a_path_in_the_documents_exists(doc: str, path: str) -> None:
    assert _exists(path), f"{doc} names {path}, which is not in the repository"
