"""What the request endpoints' contenders share: the payload and reply, and the keys' seeds."""

from __future__ import annotations

PAYLOAD = {"task": "summarize", "args": {"doc": "q3-report.pdf", "max_words": 120}, "priority": 2}
REPLY = {"ok": True, "words": 118}
ONEWAY = {**PAYLOAD, "oneway": "event"}  # a one-way message of the oneway scenario
CLIENT_SEED = bytes(range(32))
SERVER_SEED = bytes(range(32, 64))
