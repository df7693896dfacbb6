"""Rewrite proto/testvectors/mcp.json: MCP over IAC payloads and signed messages (deterministic).

    .venv/bin/python -m tools.make_mcp_vectors

See tools/vectors/mcp.py and docs/PROTOCOL.md ("Extension: MCP over IAC").
"""

from __future__ import annotations

from pathlib import Path

from tools.vectors.mcp import write_mcp_vectors

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    write_mcp_vectors(ROOT / "proto" / "testvectors" / "mcp.json")
