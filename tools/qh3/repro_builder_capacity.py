"""A qh3 server's datagrams_to_send raises 'packet builder capacity exhausted' answering aioquic.

    python tools/qh3/repro_builder_capacity.py [--client aioquic|qh3] [--runs 5] [--extra-alpn N]

Needs qh3 and, for the default client, aioquic (``pip install qh3 aioquic``); no IAC code. A qh3
server ``QuicConnection`` and a client ``QuicConnection`` (sans-IO) talk over an in-memory link
with a virtual clock (one-way delay 1 ms, nothing lost or reordered) until the handshake has
completed on both sides; then the client sends 200 messages on unidirectional streams (one
300-byte write with FIN each, within the stream credit) and the server must receive them all.

What is counted: each ``datagrams_to_send()`` of the server that raised. With an aioquic 1.7
client it raises as the server answers the very first datagram (a 1,200-byte Initial carrying a
small ClientHello, padded), so the server sends nothing until the client's probe timer resends
its Initial; the handshake then completes, late. No load is needed. With a qh3 client (whose
ClientHello, with its post-quantum key share, fills two datagrams) it does not raise. A larger
aioquic ClientHello (``--extra-alpn 4``: four more 51-byte ALPN names offered) does not trigger
it either. Seen with qh3 2.1.0 and aioquic 1.7.2: raised in every run with the defaults.

The last line says whether it reproduced; exit status 1 when it did, 0 when not.
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
MESSAGES = 200


def make_client(library: str, alpn: list[str]) -> Any:
    if library == "aioquic":
        from aioquic.quic.configuration import QuicConfiguration as ClientConfiguration
        from aioquic.quic.connection import QuicConnection as ClientConnection
    else:
        ClientConfiguration, ClientConnection = QuicConfiguration, QuicConnection
    return ClientConnection(
        configuration=ClientConfiguration(
            is_client=True, alpn_protocols=alpn, verify_mode=0, server_name="localhost"
        )
    )


def client_credit(client: Any) -> int:
    """The server's stream credit for the client's unidirectional streams."""
    if hasattr(client, "max_concurrent_uni_streams"):  # qh3
        return int(client.max_concurrent_uni_streams)
    return int(client._remote_max_streams_uni)  # aioquic keeps it private


def run_once(library: str, extra_alpn: int) -> tuple[list[str], str]:
    """One connection; ``(the server's exceptions, a summary line)``."""
    alpn = ["repro"] + [f"{'x' * 50}{i}" for i in range(extra_alpn)]
    client = make_client(library, alpn)
    server_config = QuicConfiguration(is_client=False, alpn_protocols=alpn)
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
    handshake_at: dict[str, float] = {}
    errors: list[str] = []
    sent = received = 0
    wire: list[tuple[float, int, str, bytes, tuple[str, int]]] = []
    seq = 0
    for _ in range(100_000):
        for name, quic in sides.items():
            while (event := quic.next_event()) is not None:
                kind = type(event).__name__
                if kind == "HandshakeCompleted":
                    handshake_at[name] = now
                elif kind == "StreamDataReceived" and event.end_stream and name == "server":
                    received += 1
                elif kind == "ConnectionTerminated":
                    return errors, f"{name}: connection terminated: {event!r}"
            if name == "client" and "client" in handshake_at:
                while sent < MESSAGES:
                    stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
                    if stream_id // 4 >= client_credit(quic):
                        break
                    quic.send_stream_data(stream_id, bytes(300), end_stream=True)
                    sent += 1
            try:
                datagrams = quic.datagrams_to_send(now)
            except Exception as exc:
                if name == "client":
                    raise
                errors.append(f"{exc!r} at {now * 1000:.0f} ms")
                datagrams = []
            for data, _addr in datagrams:
                seq += 1
                heapq.heappush(wire, (now + DELAY, seq, peer[name], data, source[name]))
        if received >= MESSAGES:
            at = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in handshake_at.items())
            return errors, f"handshake completed at {at}; {received} messages arrived"
        due = [t for q in sides.values() if (t := q.get_timer()) is not None]
        if wire:
            due.append(wire[0][0])
        if not due:
            return errors, "stalled: nothing to send and no timer"
        now = max(now, min(due))
        if now > 60:
            return errors, f"stalled: handshake {handshake_at}, {received} messages after 60 s"
        while wire and wire[0][0] <= now:
            _, _, to, data, addr = heapq.heappop(wire)
            sides[to].receive_datagram(data, addr, now)
        for quic in sides.values():
            timer = quic.get_timer()
            if timer is not None and timer <= now:
                quic.handle_timer(now)
    return errors, "gave up after 100,000 turns"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=["aioquic", "qh3"], default="aioquic")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--extra-alpn", type=int, default=0, help="more ALPN names: a larger ClientHello")
    args = parser.parse_args()
    import qh3

    versions = f"qh3 {qh3.__version__} server"
    if args.client == "aioquic":
        import aioquic

        versions += f", aioquic {aioquic.__version__} client"
    else:
        versions += ", qh3 client"
    print(f"{versions}, {args.extra_alpn} extra ALPN names")
    reproduced = 0
    for run in range(args.runs):
        errors, summary = run_once(args.client, args.extra_alpn)
        if any("packet builder capacity exhausted" in e for e in errors):
            reproduced += 1
            print(
                f"run {run}: REPRODUCED: server raised {len(errors)} times, first {errors[0]}, "
                f"last at {errors[-1].rsplit(' at ', 1)[1]}; {summary}"
            )
        elif errors:
            print(f"run {run}: other exception: {errors[0]}; {summary}")
        else:
            print(f"run {run}: not reproduced: {summary}")
    verdict = "REPRODUCED" if reproduced else "not reproduced"
    print(f"{verdict}: 'packet builder capacity exhausted' in {reproduced} of {args.runs} runs")
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(main())
