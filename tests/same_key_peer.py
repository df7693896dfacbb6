"""A node with a given key in its own process (tests/test_liveness.py kills it with SIGKILL).

Run as ``python tests/same_key_peer.py KEY_FILE SERVER_ID SERVER_URL``. It dials the server and
answers commands on stdin, one JSON line each on stdout:

* ``req``: a RUN request (timeout 10 s): ``{"ok": payload, "s": seconds}`` or ``{"error": text}``.
* ``wait``: wait (at most 10 s) until its first connection to the server closes:
  ``{"closed": close_code}`` (``null`` if it stayed open).

It prints ``{"ready": true}`` once connected. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from iac.errors import IacError
from iac.node.node import Node
from iac.wire.identity import Identity


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(key: str, server: str, url: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
    async with Node(Identity.load(key)) as node:
        node.add_peer(server, url)
        # the connection itself (Node.connect returns nothing): it may be refused at once
        first = await node._peers.connect(server)
        emit({"ready": True})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            cmd = line.decode().strip()
            if cmd == "req":
                t0 = time.monotonic()
                try:
                    reply = await node.request(server, "RUN", {"pid": 1}, timeout=10)
                    emit({"ok": reply.payload, "s": time.monotonic() - t0})
                except IacError as exc:
                    emit({"error": str(exc)})
            elif cmd == "wait":
                conn = first
                code = None
                if conn is not None:
                    try:
                        async with asyncio.timeout(10):
                            await conn.wait_closed()
                        code = getattr(conn.close_error, "code", None)
                    except TimeoutError:
                        pass
                emit({"closed": code, "error": repr(conn.close_error) if conn is not None else None})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
