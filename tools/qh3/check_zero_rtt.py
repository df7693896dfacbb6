"""qh3 alone resumes a session and delivers 0-RTT early data (the check behind a failure that is not qh3's).

    python tools/qh3/check_zero_rtt.py [--runs 5]

Needs only qh3 (``pip install qh3``); no IAC code. A qh3 client and a qh3 server
``QuicConnection`` (sans-IO, in-memory link, virtual clock, 1 ms one way) complete a handshake;
the server's session ticket (kept by a ticket fetcher/handler pair, each ticket used once) is
given to a second client, which writes before its handshake (so as 0-RTT early data) on a
bidirectional stream (where IAC's HELLO goes) and on a unidirectional stream. The check passes
when the second session is resumed, the early data is accepted and both writes arrive.

The last line says whether every run passed; exit status 1 when one did not. Seen with qh3
2.1.0: passed in every run.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from typing import Any

from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection

# A throwaway self-signed P-256 certificate and key for "localhost" (loopback tests only).
CERT = b"""-----BEGIN CERTIFICATE-----
MIIBmjCCAUGgAwIBAgIUIT6GbauzHVwVxivHuFBdmKUXf+0wCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwMTEwNDg1MVoYDzIxMjYxMTA3
MTA0ODUxWjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQgBHcGFgkGow6xe+KKnIxCLr43xQDqgTgGpnYVpIs8KR03oYyXi8xs
GV0HniclFAAwSxR77mlsXQqmcfXcQEYao28wbTAdBgNVHQ4EFgQU4bylc0Ct+Xb8
SN0Bz6Az9+BuU3kwHwYDVR0jBBgwFoAU4bylc0Ct+Xb8SN0Bz6Az9+BuU3kwDwYD
VR0TAQH/BAUwAwEB/zAaBgNVHREEEzARgglsb2NhbGhvc3SHBH8AAAEwCgYIKoZI
zj0EAwIDRwAwRAIgJ1NUHpSrOCUPUDiOAfE9UrO6eOP8bvAf3VUwJa8ZMrYCIG50
pYI5fqL5vMDQEolGwnb3ya1Bc2Nsv1GnXit/TVo+
-----END CERTIFICATE-----
"""
KEY = b"""-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgvZeTwM3PAwnlq4Xw
PtLQu0x5Mv/Y8ab9l+9lgpYv/SChRANCAAQgBHcGFgkGow6xe+KKnIxCLr43xQDq
gTgGpnYVpIs8KR03oYyXi8xsGV0HniclFAAwSxR77mlsXQqmcfXcQEYa
-----END PRIVATE KEY-----
"""
CLIENT_ADDR = ("127.0.0.1", 50000)
SERVER_ADDR = ("127.0.0.1", 4433)
DELAY = 0.001  # one-way, seconds of virtual time
EARLY = {"bidi": b"hello-in-0-rtt", "uni": b"message-in-0-rtt"}


class Tickets:
    """The server's tickets, each taken out when used; the client's last ticket."""

    def __init__(self) -> None:
        self.server: dict[bytes, Any] = {}
        self.client: list[Any] = []

    def fetch(self, label: bytes) -> Any:
        return self.server.pop(label, None)

    def add(self, ticket: Any) -> None:
        self.server[ticket.ticket] = ticket


def connect(tickets: Tickets, ticket: Any = None) -> dict[str, Any]:
    """One connection (with early writes when ``ticket`` is given); what each side saw."""
    client = QuicConnection(
        configuration=QuicConfiguration(
            is_client=True,
            alpn_protocols=["repro"],
            verify_mode=0,
            server_name="localhost",
            session_ticket=ticket,
        ),
        session_ticket_handler=tickets.client.append,
    )
    server_config = QuicConfiguration(is_client=False, alpn_protocols=["repro"])
    server_config.load_cert_chain(CERT, KEY)
    now = 0.0
    client.connect(SERVER_ADDR, now)
    server = QuicConnection(
        configuration=server_config,
        original_destination_connection_id=client.original_destination_connection_id,
        session_ticket_fetcher=tickets.fetch,
        session_ticket_handler=tickets.add,
    )
    if ticket is not None:  # before the handshake: these go as 0-RTT early data
        client.send_stream_data(client.get_next_available_stream_id(), EARLY["bidi"])
        uni = client.get_next_available_stream_id(is_unidirectional=True)
        client.send_stream_data(uni, EARLY["uni"], end_stream=True)
    sides = {"client": client, "server": server}
    peer = {"client": "server", "server": "client"}
    source = {"client": CLIENT_ADDR, "server": SERVER_ADDR}
    seen: dict[str, Any] = {"handshake": {}, "received": b""}
    wire: list[tuple[float, int, str, bytes, tuple[str, int]]] = []
    seq = 0
    while now < 1.0:  # a second of virtual time: handshake, tickets, early data
        for name, quic in sides.items():
            while (event := quic.next_event()) is not None:
                kind = type(event).__name__
                if kind == "HandshakeCompleted":
                    seen["handshake"][name] = (event.session_resumed, event.early_data_accepted)
                elif kind == "StreamDataReceived" and name == "server":
                    seen["received"] += event.data
            for data, _addr in quic.datagrams_to_send(now):
                seq += 1
                heapq.heappush(wire, (now + DELAY, seq, peer[name], data, source[name]))
        due = [t for q in sides.values() if (t := q.get_timer()) is not None]
        if wire:
            due.append(wire[0][0])
        if not due:
            break
        now = max(now, min(due))
        while wire and wire[0][0] <= now:
            _, _, to, data, addr = heapq.heappop(wire)
            sides[to].receive_datagram(data, addr, now)
        for quic in sides.values():
            timer = quic.get_timer()
            if timer is not None and timer <= now:
                quic.handle_timer(now)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import qh3

    print(f"qh3 {qh3.__version__} client and server")
    passed = 0
    for run in range(args.runs):
        tickets = Tickets()
        first = connect(tickets)
        if not tickets.client:
            print(f"run {run}: FAILED: no session ticket after the first handshake {first['handshake']}")
            continue
        second = connect(tickets, tickets.client[-1])
        resumed = second["handshake"].get("server") == (True, True)
        arrived = all(data in second["received"] for data in EARLY.values())
        ok = resumed and arrived
        passed += ok
        print(
            f"run {run}: {'passed' if ok else 'FAILED'}: (resumed, early data accepted) "
            f"{second['handshake']}, early writes arrived: {arrived}"
        )
    verdict = "passed" if passed == args.runs else "FAILED"
    print(f"{verdict}: 0-RTT resumption with early data in {passed} of {args.runs} runs")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
