"""Compact JSON text: the one way IAC writes JSON that is not canonical.

``payload_json`` fields, JSON printed by the command line and the demo's event lines are
written without whitespace (``{"a":1,"b":[2,3]}``). Canonical JSON, which records and
statements are signed over, has stricter rules and lives in :mod:`iac.protocol.canonical`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# One encoder each, built once: ``json.dumps`` with non-default options builds one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_COMPACT = _ENCODER.encode
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode

# The C accelerators json.dumps and json.loads run on, called directly (the Python layers around
# them, JSONEncoder.encode/iterencode and JSONDecoder.decode/raw_decode, are four calls per value
# on every message); without them, the json functions themselves.
_Scan = Callable[[str, int], tuple[Any, int]]
_scan: _Scan | None
try:
    from _json import encode_basestring as _escape
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner
except ImportError:  # pragma: no cover - CPython has them
    _make_encoder = None  # type: ignore[assignment,misc]
    _scan = None
else:
    _scan = _make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # what json.loads's decoder uses
_DEFAULT = _ENCODER.default


def dumps_compact(value: Any, *, ensure_ascii: bool = False) -> str:
    """``value`` as JSON without whitespace: ``json.dumps(value, separators=(",", ":"))``.

    Non-ASCII characters are written as they are (UTF-8 once encoded) unless ``ensure_ascii``,
    which escapes them as ``\\uXXXX``. Raises :class:`TypeError` for a value that is not JSON and
    :class:`ValueError` for a circular one, as :func:`json.dumps` does.
    """
    if ensure_ascii:
        return _COMPACT_ASCII(value)
    if _make_encoder is None or type(value) is str:
        return _COMPACT(value)
    # JSONEncoder.iterencode's one-shot C encoder (a markers dict per call: circular values)
    return "".join(_make_encoder({}, _DEFAULT, _escape, None, ":", ",", False, False, True)(value, 0))


#: Whitespace JSON allows before a value.
_SPACE = frozenset(" \t\n\r")


def loads_text(text: str) -> Any:
    """``json.loads(text)`` for a str: the same value, or the same :class:`json.JSONDecodeError`.

    A value that fills the text exactly is scanned in one call; anything else (whitespace around
    it, a byte-order mark, an error) is left to :func:`json.loads`, which says what is wrong."""
    if _scan is None or not text or text[0] in _SPACE:
        return json.loads(text)
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


__all__ = ["dumps_compact", "loads_text"]
