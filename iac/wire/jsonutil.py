"""Compact JSON text: the one way IAC writes JSON that is not canonical.

``payload_json`` fields, JSON printed by the command line and the demo's event lines are
written without whitespace (``{"a":1,"b":[2,3]}``). Canonical JSON, which records and
statements are signed over, has stricter rules and lives in :mod:`iac.protocol.canonical`.
"""

from __future__ import annotations

import json
from typing import Any

# One encoder each, built once: ``json.dumps`` with non-default options builds one per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def dumps_compact(value: Any, *, ensure_ascii: bool = False) -> str:
    """``value`` as JSON without whitespace: ``json.dumps(value, separators=(",", ":"))``.

    Non-ASCII characters are written as they are (UTF-8 once encoded) unless ``ensure_ascii``,
    which escapes them as ``\\uXXXX``. Raises :class:`TypeError` for a value that is not JSON and
    :class:`ValueError` for a circular one, as :func:`json.dumps` does.
    """
    return _COMPACT_ASCII(value) if ensure_ascii else _COMPACT(value)


__all__ = ["dumps_compact"]
