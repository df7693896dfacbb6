"""The endpoints of the ``cc`` scenario, run inside the link emulator's namespaces: a bulk sender or a
request client against a sink or echo server, IAC over QUIC (BBR, CUBIC, Reno) or TLS/TCP, with the
sender's congestion state sampled. ``python -m iac.bench.contenders.ccflows sink|echo|bulk|requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from iac.bench.harness.process import commands, say, stdin_lines

FRAME_BYTES = 16 * 1024
REQUEST_BYTES = 200
TCP_INFO_LEN = 232
TRACE_EVERY = 0.5  # seconds between two samples of the sender's congestion state
ARRIVAL_GRAIN = 0.01  # the sink keeps one (time, bytes so far) per this many seconds
TCPI_BYTES_SENT, TCPI_BYTES_RETRANS = 200, 208  # offsets of two u64 in struct tcp_info


# --- endpoints (run inside the namespaces) ------------------------------------------------------


def _udp_errors() -> dict[str, int]:
    """This namespace's UDP receive errors (a receiver too slow for its socket buffer)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = [
            ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Udp:")
        ]
        udp = dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=False))
        return {"in_errors": udp.get("InErrors", 0), "rcvbuf_errors": udp.get("RcvbufErrors", 0)}
    return {}


async def serve(role: str, host: str) -> int:
    """``sink``: count each connection's bytes by arrival time; ``echo``: answer every frame."""
    from iac.errors import IacError
    from iac.transport import listen
    from iac.transport.base import Connection, TransportConfig
    from iac.wire.frames import FrameType, encode_frame
    from iac.wire.identity import Identity

    loop = asyncio.get_running_loop()
    runs: dict[str, list[tuple[float, int]]] = {}  # run id -> (arrival time, bytes so far)
    conns: dict[str, Connection] = {}
    closing: set[asyncio.Task[None]] = set()

    async def sink(conn: Connection) -> None:
        # Goodput is counted where the bytes arrive in order: QUIC stream data as the library
        # hands it over (IAC puts every frame on a stream of its own and the library serves its
        # streams round robin, so whole frames complete together, up to the peer's stream
        # credit at once), TLS frames as they are read. The sender's first frame names the run.
        arrivals: list[tuple[float, int]] = []
        total = 0

        def count(n: int) -> None:
            nonlocal total
            total += n
            now = loop.time()
            if arrivals and now - arrivals[-1][0] < ARRIVAL_GRAIN:
                arrivals[-1] = (arrivals[-1][0], total)
            else:
                arrivals.append((now, total))

        on_event = getattr(conn, "on_quic_event", None)
        if on_event is not None:
            from aioquic.quic.events import StreamDataReceived

            def counted(event: Any) -> None:
                if isinstance(event, StreamDataReceived):
                    count(len(event.data))
                on_event(event)

            conn.on_quic_event = counted  # type: ignore[attr-defined]
        with contextlib.suppress(IacError):
            while True:
                for it in await conn.recv_many(256):
                    body = it.frame.body
                    if len(body) < 64 and body.startswith(b"run:"):
                        runs[body[4:].decode()] = arrivals
                        conns[body[4:].decode()] = conn
                    elif on_event is None:
                        count(len(body))

    async def echo(conn: Connection) -> None:
        with contextlib.suppress(IacError):
            while True:
                item = await conn.recv()
                await conn.send(encode_frame(FrameType.MESSAGE, item.frame.body))

    identity = Identity.generate()
    config = TransportConfig()
    handler = sink if role == "sink" else echo
    listeners = [await listen(f"{s}://{host}:0", identity, handler, config=config) for s in ("quic", "tls")]
    say({"ready": True, "agent_id": identity.agent_id, "urls": [ln.addresses[0] for ln in listeners]})
    try:
        async for cmd in commands():
            if cmd.get("cmd") == "report":
                arrivals = runs.pop(cmd["run"], [])
                got = [n for t, n in arrivals if t <= cmd["stop"]]
                conn = conns.pop(cmd["run"], None)
                if conn is not None:
                    closing.add(loop.create_task(conn.close()))
                timeline, mark = [], 0.0
                for t, n in arrivals:  # bytes so far every TRACE_EVERY seconds of the run
                    if t >= mark:
                        timeline.append((round(t - cmd["start"], 3), n))
                        mark = cmd["start"] + TRACE_EVERY * (int((t - cmd["start"]) / TRACE_EVERY) + 1)
                say(
                    {
                        "timeline": timeline,
                        "bytes": got[-1] if got else 0,
                        "total": arrivals[-1][1] if arrivals else 0,
                        "first": arrivals[0][0] if arrivals else None,
                        "udp": _udp_errors(),
                    }
                )
    finally:
        for ln in listeners:
            await ln.close()
    return 0


def _tcp_socket(conn: Any) -> socket.socket | None:
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock if isinstance(sock, socket.socket) or hasattr(sock, "setsockopt") else None


def _set_tcp_congestion(conn: Any, name: str) -> str:
    """Put the connection's TCP socket on the kernel's ``name``; the algorithm it now runs."""
    sock = _tcp_socket(conn)
    if sock is None:
        raise RuntimeError("no TCP socket on this connection")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    return bytes(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)).split(b"\0")[0].decode()


def _tcp_info(conn: Any) -> bytes | None:
    sock = _tcp_socket(conn)
    return None if sock is None else sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)


def _tcp_counters(conn: Any) -> dict[str, int]:
    info = _tcp_info(conn)
    if info is None or len(info) < TCPI_BYTES_RETRANS + 8:
        return {}
    return {
        "sent_bytes": struct.unpack_from("<Q", info, TCPI_BYTES_SENT)[0],
        "retrans_bytes": struct.unpack_from("<Q", info, TCPI_BYTES_RETRANS)[0],
    }


def _cc_state(conn: Any, t: float) -> dict[str, Any]:
    """What the sender's congestion control holds now (QUIC) or the kernel's tcp_info (TCP)."""
    quic = getattr(conn, "_quic", None)
    if quic is None:
        info = _tcp_info(conn)
        if info is None:
            return {"t": round(t, 2)}
        rtt_us, cwnd = struct.unpack_from("<II", info, 68)[0], struct.unpack_from("<I", info, 80)[0]
        return {"t": round(t, 2), "cwnd_pkts": cwnd, "srtt_ms": rtt_us / 1e3}
    cc = quic._loss._cc
    out = {"t": round(t, 2), "cwnd": cc.congestion_window, "in_flight": cc.bytes_in_flight}
    bbr = getattr(cc, "bbr", None)
    if bbr is not None:
        out.update(
            mode=bbr.mode.value,
            bw_mbit=round(bbr.bw * 8 / 1e6, 2),
            pacing_mbit=round(bbr.pacing_rate * 8 / 1e6, 2),
            min_rtt_ms=round(bbr.min_rtt * 1e3, 2) if bbr.min_rtt < 1e9 else None,
        )
    return out


class _QuicCounters:
    """Bytes aioquic sent in flight and declared lost (or re-sent on a probe timeout)."""

    def __init__(self, conn: Any) -> None:
        self.sent = self.lost = 0
        cc = conn._quic._loss._cc
        sent = cc.on_packet_sent

        def on_sent(*, packet: Any) -> None:
            self.sent += packet.sent_bytes
            sent(packet=packet)

        def losing(gone: Callable[..., None]) -> Callable[..., None]:
            def counted(*, packets: Iterable[Any], **kw: Any) -> None:  # lost (now=...) or expired
                packets = list(packets)
                self.lost += sum(p.sent_bytes for p in packets)
                gone(packets=packets, **kw)

            return counted

        cc.on_packet_sent = on_sent
        cc.on_packets_lost, cc.on_packets_expired = losing(cc.on_packets_lost), losing(cc.on_packets_expired)
        self.algorithm = type(cc).__name__


def link_mechanisms_off(config: Any) -> Any:  # PMTUD, GSO, ACK frequency: the fields this version has
    off = {f.name for f in dataclasses.fields(config)} & {"quic_pmtud", "quic_gso", "quic_ack_frequency"}
    return dataclasses.replace(config, **dict.fromkeys(off, False))


async def flow(args: argparse.Namespace) -> int:
    """``bulk`` or ``requests``: dial, say ready, run on "go", report, exit at once."""
    from iac.transport import dial
    from iac.transport.base import DEFAULT_CONGESTION, TransportConfig
    from iac.wire.frames import FrameType, encode_frame
    from iac.wire.identity import Identity

    role, transport, cc, seconds, warmup = args.role, args.transport, args.cc, args.seconds, args.warmup
    target = json.loads(args.target)
    url = next(u for u in target["urls"] if u.startswith(transport + "://"))
    config = TransportConfig(
        congestion=cc if transport == "quic" else DEFAULT_CONGESTION, send_queue_bytes=1 << 20
    )
    config = config if args.link == "on" else link_mechanisms_off(config)
    conn = await dial(url, Identity.generate(), expect=target["agent_id"], config=config)
    counters: _QuicCounters | None = None
    if transport == "tls":
        running = _set_tcp_congestion(conn, cc)
    else:
        counters = _QuicCounters(conn)
        running = counters.algorithm
    if role == "bulk":
        await conn.send(encode_frame(FrameType.MESSAGE, b"run:" + args.run.encode()))
    say({"ready": True, "algorithm": running})
    reader = await stdin_lines()
    await reader.readline()  # go
    loop = asyncio.get_running_loop()
    start, cpu0 = loop.time(), time.process_time()
    stop = start + seconds
    out: dict[str, Any] = {"start": start, "stop": stop}
    if role == "bulk":
        frame = encode_frame(FrameType.MESSAGE, os.urandom(FRAME_BYTES))

        async def pump() -> None:
            while True:
                await conn.send(frame)

        task = loop.create_task(pump())
        trace = []
        for _ in range(int(seconds / TRACE_EVERY)):
            await asyncio.sleep(TRACE_EVERY)
            trace.append(_cc_state(conn, loop.time() - start))
        await asyncio.sleep(max(0.0, stop - loop.time()))
        task.cancel()
        out["trace"] = trace
    else:
        request = encode_frame(FrameType.MESSAGE, os.urandom(REQUEST_BYTES))
        lat: list[float] = []
        await asyncio.sleep(warmup)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds - warmup + 5.0):
                while loop.time() < stop:
                    t = time.perf_counter()
                    await conn.send(request)
                    await conn.recv()
                    lat.append((time.perf_counter() - t) * 1e3)
        out["lat_ms"] = [round(x, 3) for x in lat]
    out["cpu_s"] = time.process_time() - cpu0
    pmtu = getattr(conn, "path_mtu", None)
    if transport == "quic":
        out["datagram_bytes"] = pmtu.mtu if pmtu is not None else 1200
    quic_counts = None if counters is None else {"sent_bytes": counters.sent, "retrans_bytes": counters.lost}
    out.update(quic_counts or _tcp_counters(conn))
    sock = _tcp_socket(conn)
    if sock is not None:  # end now: no lingering send buffer reaches the next run
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    say(out)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="(internal) an endpoint of the cc scenario")
    sub = ap.add_subparsers(dest="role", required=True)
    for role in ("sink", "echo"):
        sub.add_parser(role).add_argument("--host", default="127.0.0.1")
    for role in ("bulk", "requests"):
        f = sub.add_parser(role)
        f.add_argument("--target", required=True)
        f.add_argument("--transport", choices=("quic", "tls"), required=True)
        f.add_argument("--cc", required=True)
        f.add_argument("--seconds", type=float, required=True)
        f.add_argument("--run", default="r0")
        f.add_argument("--warmup", type=float, default=1.0)
        f.add_argument("--link", choices=("on", "off"), default="on", help="QUIC PMTUD, GSO, ACK freq.")
    args = ap.parse_args(argv)
    if args.role in ("sink", "echo"):
        return asyncio.run(serve(args.role, args.host))
    return asyncio.run(flow(args))


if __name__ == "__main__":
    sys.exit(main())
