"""qh3's native core raises ValueError('reserved stream is missing') from datagrams_to_send.

    python tools/qh3/repro_reserved_stream.py [--runs 5] [--messages 2000] [--reorder 0.1] [--loss 0]

Needs only qh3 (``pip install qh3``); no IAC code. Two qh3 ``QuicConnection`` objects (sans-IO)
talk over an in-memory link with a virtual clock: one-way delay 1 ms, and a seeded fraction of
the datagrams (``--reorder``, default 10 %) held back up to 4 ms more, so they arrive out of
order; nothing is lost unless ``--loss`` says so. After the handshake both sides send
``--messages`` messages at the same time, the way IAC's QUIC adapter does: each message is one
300-byte write with FIN on a new unidirectional stream, opened only while the peer's stream
credit (``max_concurrent_uni_streams``) allows it, up to 64 per turn, and ``datagrams_to_send``
is called once after each turn.

Each run (seed 0, 1, ...) prints whether the exception was raised, on which side and after how
many messages, and the last line says in how many runs it reproduced. Exit status 1 when it
reproduced, 0 when not. Seen with qh3 2.1.0 (runs in which it was raised):

* defaults (both sides send, 10 % reordered, nothing lost): 15 of 20;
* ``--reorder 0 --loss 0.05``: 10 of 10; ``--reorder 0 --loss 0.02``: 3 of 10;
* ``--reorder 0`` (nothing reordered or lost): 0 of 10;
* ``--one-way`` (only the client sends): 0 of 10; with ``--loss 0.02`` too: 2 of 10;
* ``--messages 300``: 1 of 10.

So it takes recovery from reordering or loss (retransmissions) while streams come and go
quickly, mostly with both sides sending.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys

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
MESSAGE_SIZE = 300
PER_TURN = 64


def run_once(seed: int, messages: int, reorder: float, loss: float, both: bool) -> tuple[str | None, str]:
    """One exchange; ``(the exception raised by qh3 or None, a summary line)``."""
    rnd = random.Random(seed)
    client = QuicConnection(
        configuration=QuicConfiguration(
            is_client=True, alpn_protocols=["repro"], verify_mode=0, server_name="localhost"
        )
    )
    server_config = QuicConfiguration(is_client=False, alpn_protocols=["repro"])
    server_config.load_cert_chain(CERT, KEY)
    now = 0.0
    client.connect(SERVER_ADDR, now)
    server = QuicConnection(
        configuration=server_config,
        original_destination_connection_id=client.original_destination_connection_id,
    )
    sides = {"client": client, "server": server}
    peer = {"client": "server", "server": "client"}
    source = {"client": CLIENT_ADDR, "server": SERVER_ADDR}
    ready = dict.fromkeys(sides, False)
    sent = dict.fromkeys(sides, 0)
    finished = dict.fromkeys(sides, 0)  # streams received complete (FIN)
    wire: list[tuple[float, int, str, bytes, tuple[str, int]]] = []
    seq = 0
    payload = bytes(MESSAGE_SIZE)

    def raised(name: str, where: str, exc: Exception) -> str:
        return f"{name} {where}: {exc!r} after {sent['client']}+{sent['server']} messages sent"

    for _ in range(1_000_000):
        for name, quic in sides.items():
            while (event := quic.next_event()) is not None:
                kind = type(event).__name__
                if kind == "HandshakeCompleted":
                    ready[name] = True
                elif kind == "StreamDataReceived" and event.end_stream:
                    finished[name] += 1
                elif kind == "ConnectionTerminated":
                    return None, f"{name}: connection terminated: {event!r}"
            # a turn: new unidirectional streams within the peer's credit, one write + FIN each
            if ready[name] and (both or name == "client"):
                for _ in range(PER_TURN):
                    stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
                    if sent[name] >= messages or stream_id // 4 >= quic.max_concurrent_uni_streams:
                        break
                    quic.send_stream_data(stream_id, payload, end_stream=True)
                    sent[name] += 1
            try:
                datagrams = quic.datagrams_to_send(now)
            except Exception as exc:
                return raised(name, "datagrams_to_send", exc), ""
            for data, _addr in datagrams:
                if rnd.random() < loss:
                    continue
                late = rnd.random() * 4 * DELAY if rnd.random() < reorder else 0.0
                seq += 1
                heapq.heappush(wire, (now + DELAY + late, seq, peer[name], data, source[name]))
        if finished["server"] >= messages and finished["client"] >= (messages if both else 0):
            return None, f"all {messages} messages arrived ({now:.2f} s of virtual time)"
        # on to the next arrival or timer: what is due arrives, timers fire
        due = [t for q in sides.values() if (t := q.get_timer()) is not None]
        if wire:
            due.append(wire[0][0])
        if not due:
            return None, "stalled: nothing to send and no timer"
        now = max(now, min(due))
        if now > 120:
            return None, f"stalled: {finished} complete streams after 120 s of virtual time"
        while wire and wire[0][0] <= now:
            _, _, to, data, addr = heapq.heappop(wire)
            try:
                sides[to].receive_datagram(data, addr, now)
            except Exception as exc:
                return raised(to, "receive_datagram", exc), ""
        for name, quic in sides.items():
            timer = quic.get_timer()
            if timer is not None and timer <= now:
                try:
                    quic.handle_timer(now)
                except Exception as exc:
                    return raised(name, "handle_timer", exc), ""
    return None, "gave up after 1,000,000 turns"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs, with seeds 0, 1, ...")
    parser.add_argument("--messages", type=int, default=2000, help="messages each way")
    parser.add_argument("--reorder", type=float, default=0.1, help="fraction of datagrams delayed")
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of datagrams dropped")
    parser.add_argument("--one-way", action="store_true", help="only the client sends")
    args = parser.parse_args()
    import qh3

    print(f"qh3 {qh3.__version__}, {args.messages} messages, reorder {args.reorder}, loss {args.loss}")
    reproduced = 0
    for seed in range(args.runs):
        error, summary = run_once(seed, args.messages, args.reorder, args.loss, not args.one_way)
        if error is not None and "reserved stream is missing" in error:
            reproduced += 1
            print(f"seed {seed}: REPRODUCED: {error}")
        elif error is not None:
            print(f"seed {seed}: other exception: {error}")
        else:
            print(f"seed {seed}: not reproduced: {summary}")
    verdict = "REPRODUCED" if reproduced else "not reproduced"
    print(f"{verdict}: 'reserved stream is missing' in {reproduced} of {args.runs} runs")
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(main())
