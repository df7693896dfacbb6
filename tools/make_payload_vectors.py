"""Rewrite proto/testvectors/payloads-v1.json: the JSON payloads a real node writes (deterministic).

    .venv/bin/python -m tools.make_payload_vectors

Runs a node on a UNIX socket with a frozen wall clock and fixed seeds and session ids; see
tools/vectors/payloads.py and docs/PROTOCOL.md ("Payload schemas and their vectors").
"""

from __future__ import annotations

from pathlib import Path

from tools.vectors.payloads import write_payload_vectors

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    write_payload_vectors(ROOT / "proto" / "testvectors" / "payloads-v1.json")
