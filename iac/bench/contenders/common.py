"""What the request endpoints' contenders share: the payload and reply, the keys' seeds, and the
server and client interfaces (:class:`Server`, :class:`Client`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PAYLOAD = {"task": "summarize", "args": {"doc": "q3-report.pdf", "max_words": 120}, "priority": 2}


REPLY = {"ok": True, "words": 118}


ONEWAY = {**PAYLOAD, "oneway": "event"}  # a one-way message of the oneway scenario


CLIENT_SEED = bytes(range(32))


SERVER_SEED = bytes(range(32, 64))


class Server:
    handled = 0
    events = 0

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class Client:
    async def start(self, target: dict[str, Any], depth: int) -> None:
        raise NotImplementedError

    async def one(self, i: int) -> None:
        raise NotImplementedError

    def frame_bytes(self) -> int | None:
        return None

    async def close(self) -> None:
        pass
