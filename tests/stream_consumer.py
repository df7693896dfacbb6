"""A stream consumer in its own process (tests/test_liveness.py kills it with SIGKILL).

Run as ``python tests/stream_consumer.py PRODUCER_ID PRODUCER_URL``: it asks the producer for a
stream ``RUN`` with a one-hour deadline and a window of 2, prints ``{"part": n}`` for the first
part, then stops taking parts (so the producer waits for credit) until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from iac.node.node import Node


async def main(producer: str, url: str) -> None:
    async with Node() as node:
        node.add_peer(producer, url)
        async for part in node.stream(producer, "RUN", timeout=3600, window=2):
            sys.stdout.write(json.dumps({"part": part.payload}) + "\n")
            sys.stdout.flush()
            await asyncio.Event().wait()  # never takes another part


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
