"""One server of a 0-RTT cluster, for tests/test_zero_rtt.py (a real process per server).

Run as ``python tests/zero_rtt_server.py KEY_FILE CERT_FILE CERT_KEY REDIS_URL PREFIX [reuse]``.
Every server started with the same arguments has the same identity and certificate and
shares, in Redis under ``PREFIX``, the server session tickets, the HELLO nonce cache and
the message replay store. ``reuse``: tickets are not single-use (as if the ticket store
failed at it), to show what the shared nonce cache stops.

JSON lines on stdout: first ``{"url": ...}``; then ``{"got": payload}`` for each message
that passed the shared replay store. Commands on stdin: ``stats`` prints
``{"refused": ..., "tickets": {...}}``; ``quit`` ends the process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from iac.errors import IacError
from iac.protocol.replay import ReplayConfig, ReplayGuard, Verdict
from iac.protocol.tickets import check_cluster_stores
from iac.stores.nonces import RedisNonceCache
from iac.stores.redis import RedisReplayStore
from iac.stores.tickets import RedisTicketStore
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import ServerTicketStore, listen_quic
from iac.wire.identity import Identity
from iac.wire.message import open_message


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(key: str, cert: str, cert_key: str, redis_url: str, prefix: str, reuse: bool) -> None:
    identity = Identity.load(key)
    replay = RedisReplayStore(redis_url, ReplayConfig(), key_prefix=f"{prefix}:replay")
    ticket_store = RedisTicketStore(redis_url, key_prefix=f"{prefix}:tickets")
    config = TransportConfig(
        cert_file=cert,
        key_file=cert_key,
        nonce_cache=RedisNonceCache(redis_url, key_prefix=f"{prefix}:hello"),
        ticket_store=ticket_store,
    )
    check_cluster_stores(ticket_store, replay, config.nonce_cache)
    guard = ReplayGuard(replay)
    tickets = ServerTicketStore(ticket_store, reuse=reuse)

    async def on_connection(conn: Connection) -> None:
        try:
            while True:
                msg = open_message((await conn.recv()).frame.body)
                now = time.time_ns() // 1000
                verdict = guard.check_and_mark(
                    getattr(msg, "from"), msg.session_id, msg.msg_id, msg.timestamp, now
                )
                if verdict is Verdict.NEW:
                    emit({"got": msg.payload_json})
        except IacError:
            return

    listener = await listen_quic(
        "quic://127.0.0.1:0", identity, on_connection, config=config, tickets=tickets
    )
    emit({"url": listener.addresses[0]})
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line == "stats":
            emit(
                {
                    "refused": listener.refused,
                    "tickets": {"resumed": tickets.resumed, "refused": tickets.refused},
                }
            )
        elif line in ("quit", ""):
            break
    await listener.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6], reuse=sys.argv[6:7] == ["reuse"]))
