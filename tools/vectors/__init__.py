"""Generators of the test vectors in proto/testvectors/ (deterministic: fixed seeds and clocks).

* :mod:`tools.vectors.wire`: ``v1.json`` (frames, signed messages, HELLOs), written by
  ``tools/make_testvectors.py``;
* :mod:`tools.vectors.payloads`: ``payloads-v1.json`` (recorded from a real node, through
  :mod:`tools.vectors.payload_harness`), with the payload schemas in
  :mod:`tools.vectors.payload_schemas`;
* :mod:`tools.vectors.records`: ``records-v1.json`` (signed records, rotations, revocations);
* :mod:`tools.vectors.mesh`: ``mesh-v1.json`` (FILE_TRANSFER payloads, FORWARD wrappers).

Every vector file is :func:`render`'s text of its document, so a test can compare the committed
file with a fresh render byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def render(document: Any, *, ascii_only: bool = False) -> str:
    """The exact text of a vector file: ``document`` as JSON, indented by one, a newline last."""
    return json.dumps(document, indent=1, ensure_ascii=ascii_only) + "\n"


def write(path: str | Path, text: str) -> None:
    """Rewrite the vector file at ``path`` with ``text`` (UTF-8)."""
    Path(path).write_text(text, encoding="utf-8")
