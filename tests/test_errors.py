"""The error tree and the reason table: few classes, one spelling per reason."""

import ast
import builtins
import functools
import json
from pathlib import Path

import pytest

import iac
from iac.conformance.vectors import EXPECTED
from iac.errors import (
    REASONS,
    CloseCode,
    ErrorCode,
    FileTransferError,
    HandshakeError,
    IacError,
    McpBindingError,
    MessageRejected,
    ProtocolError,
    Refusal,
    all_error_classes,
)
from iac.protocol.routing import RouteRefusal

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "iac"
VECTORS = ROOT / "proto" / "testvectors"
MAX_CLASSES = 30


@functools.cache
def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text("utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def _exception_classes() -> dict[str, str]:
    """Every class defined under iac/ that derives from BaseException (by name: a builtin
    exception, an imported ``...Error``/``...Exception`` class, or another such class here)."""
    defined: dict[str, tuple[str, list[str]]] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                defined[f"{path.relative_to(ROOT)}:{node.name}"] = (node.name, bases)
    names = {key: name for key, (name, _) in defined.items()}
    local = set(names.values())

    def external(base: str) -> bool:
        obj = getattr(builtins, base, None)
        if isinstance(obj, type):
            return issubclass(obj, BaseException)
        return base not in local and base.endswith(("Error", "Exception"))

    found: set[str] = set()
    while True:
        known = {names[k] for k in found}
        more = {
            key
            for key, (name, bases) in defined.items()
            if key not in found and any(external(b) or b in known for b in bases)
        }
        if not more:
            return {key: names[key] for key in found}
        found |= more


def test_the_package_defines_at_most_30_exception_classes() -> None:
    found = _exception_classes()
    assert len(found) <= MAX_CLASSES, sorted(found)
    # the walk sees them all: the tree of iac.errors and a few outside it
    assert {c.__name__ for c in all_error_classes()} <= set(found.values())
    assert {"IacBindingError", "Failed", "LabError"} <= set(found.values())


def test_every_error_has_a_unique_class_name_that_is_its_own_reason() -> None:
    classes = all_error_classes()
    names = [c.name for c in classes]
    assert len(names) == len(set(names))
    for c in classes:
        assert issubclass(c, IacError) and c.name.islower() and " " not in c.name
        assert REASONS[c.name].cls is c, c.name
        assert c("x").reason == c.name if c.__init__ is IacError.__init__ else True


def test_iac_errors_exports_every_error() -> None:
    missing = [c.__name__ for c in all_error_classes() if getattr(iac.errors, c.__name__, None) is not c]
    assert missing == []


def test_protocol_errors_carry_the_close_code_of_their_reason() -> None:
    for row in REASONS.values():
        if issubclass(row.cls, ProtocolError):
            assert row.close is not None and row.close != CloseCode.NO_ERROR, row.name
            assert ProtocolError("x", reason=row.name).close_code == row.close
        else:
            assert row.close is None, row.name
    assert ProtocolError("x", reason="decompression_bomb").close_code == CloseCode.FRAME_TOO_LARGE
    assert HandshakeError("x", reason="wrong_peer").close_code == CloseCode.WRONG_PEER
    assert not issubclass(MessageRejected, ProtocolError)


def test_the_close_codes_of_the_vectors_are_the_table_s() -> None:
    for name, (code, _quote) in EXPECTED.items():
        assert REASONS[name].close == code, name


def _vector_names(obj: object, key: str) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        if isinstance(obj.get(key), str):
            out.add(obj[key])
        for v in obj.values():
            out |= _vector_names(v, key)
    elif isinstance(obj, list):
        for v in obj:
            out |= _vector_names(v, key)
    return out


def test_every_reason_the_vectors_name_is_in_the_table() -> None:
    for path in sorted(VECTORS.glob("*.json")):
        data = json.loads(path.read_text("utf-8"))
        for name in _vector_names(data, "error"):
            assert name in REASONS, f"{path.name}: {name}"
        for name in _vector_names(data, "refusal"):
            assert REASONS[name].counter == name, f"{path.name}: {name}"
            assert RouteRefusal(name).code == (REASONS[name].error and REASONS[name].error.value)
    mcp = json.loads((VECTORS / "mcp.json").read_text("utf-8"))
    for case in mcp["refusals"]:
        assert REASONS[case["reason"]].cls is McpBindingError, case["reason"]


def test_every_counter_is_spelled_as_its_reason() -> None:
    for refusal in [*Refusal, *RouteRefusal]:
        row = REASONS[refusal.value]
        assert row.counter == refusal.value, refusal
    for refusal in Refusal:
        assert refusal.code == REASONS[refusal.value].error
    for row in REASONS.values():
        assert row.counter is None or row.counter in REASONS, row.name
        if issubclass(row.cls, FileTransferError):
            assert FileTransferError("x", reason=row.name).fatal is row.fatal
        else:
            assert not row.fatal, row.name
    # the spellings that used to differ between errors, counters and logs
    assert {"stale", "loop", "bad_path", "sealed_header", "bad_seal", "malformed"}.isdisjoint(REASONS)
    assert REASONS["invalid_agent_id"].counter == "bad_signature"
    assert REASONS["too_many_transfers"].error == ErrorCode.BUSY


def _raise_sites() -> list[tuple[str, str, str]]:
    """(where, class, reason) for every error built under iac/ with a literal reason."""
    classes = {c.__name__ for c in all_error_classes()}
    out = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = getattr(func, "id", None) or getattr(func, "attr", "")
            if name not in classes:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            for kw in node.keywords:
                if kw.arg == "reason" and isinstance(kw.value, ast.Constant):
                    out.append((where, name, kw.value.value))
            if name == "McpBindingError" and node.args and isinstance(node.args[0], ast.Constant):
                out.append((where, name, node.args[0].value))
    return out


def test_every_reason_raised_is_in_the_table_under_its_class() -> None:
    sites = _raise_sites()
    assert len(sites) > 150  # the walk sees the raise sites
    wrong = [
        (where, cls, reason)
        for where, cls, reason in sites
        if reason not in REASONS or REASONS[reason].cls.__name__ != cls
    ]
    assert wrong == []


def test_an_unknown_reason_reads_as_its_class_s_row() -> None:
    err = MessageRejected("x", reason="no_such_reason")
    assert err.reason == "no_such_reason" and err.row is REASONS["message_rejected"]


@pytest.mark.parametrize("cls", [IacError, MessageRejected, ProtocolError])
def test_an_error_keeps_its_reason_through_pickle(cls: type[IacError]) -> None:
    import pickle

    err = cls("text", reason="stale_message")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.reason == "stale_message" and str(back) == "text"


def test_protocol_doc_lists_every_reason_and_close_code() -> None:
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    for name in REASONS:
        assert f"`{name}`" in doc, name
    for code in CloseCode:
        if code not in (CloseCode.NO_ERROR,):
            assert f"0x{code:02x}" in doc.lower() or code.name in doc, code.name


def test_the_protocol_document_s_table_is_the_reason_table() -> None:
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    start = doc.index("| reason | class | ERROR code | close code | counted as |")
    rows = doc[start:].split("\n\n", 1)[0].splitlines()[2:]
    got = {}
    for row in rows:
        name, cls, error, close, counter = (c.strip().strip("`") for c in row.strip("|").split("|"))
        got[name] = (cls.split(" ")[0], error or None, close.split(" ")[0] or None, counter or None)
    want = {
        r.name: (
            r.cls.__name__,
            r.error and r.error.value,
            None if r.close is None else f"0x{int(r.close):02x}",
            r.counter,
        )
        for r in REASONS.values()
    }
    assert got == want
