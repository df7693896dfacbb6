"""Transport benchmark: IAC over quic, tls and unix next to bare aioquic and bare TLS echoes.

    .venv/bin/iac bench --only rtt [--quick]      # the parts: rtt, setup (handshake), oneway

Everything runs in this one process on one event loop, on loopback; each part alternates its
cases round by round. What each part measures (rtt: request/reply at depth 1 and 64; handshake:
dial to the first delivered message, loopback and 20 ms RTT; oneway: messages/s next to the
codec's decode-only rate) and the targets are in benchmarks/README.md, "Transport"."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.bench.contenders.echo import (
    DEPTH,
    BareQuic,
    BareTls,
    IacClient,
    IacServer,
    TcpDelayProxy,
    start_echo_quic,
    tls_echo,
)
from iac.bench.contenders.floor import CONFIG, DICTS
from iac.bench.harness.counting import host_port
from iac.bench.harness.results import interleave_async, turn_order
from iac.bench.harness.results import summarize as summary
from iac.bench.harness.stats import median, percentile
from iac.bench.scenarios import codec  # iac/bench/scenarios/codec.py: payloads and the decode pass
from iac.testing.relay import Impairment, UdpRelay
from iac.transport import dial, listen
from iac.transport.base import Connection, Listener
from iac.transport.certs import generate_self_signed
from iac.transport.quic import dial_quic, listen_quic
from iac.transport.quic.tickets import ClientTicketStore, ServerTicketStore
from iac.transport.tls import server_context
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import decode_message_frame

ONE_WAY_DELAY = 0.010  # seconds each way: 20 ms RTT

TARGET_RTT = 1.8
TARGET_ONEWAY = 0.5
TARGET_0RTT = 0.6
TARGET_QUIC_TLS = 0.75


@dataclass(frozen=True)
class Plan:
    rounds: int
    rtt_count: int  # round trips per round at depth 1
    depth_count: int  # requests per round at depth 64
    handshakes: int  # dials per case (loopback and 20 ms)
    oneway_count: int  # messages per one-way round


FULL = Plan(rounds=9, rtt_count=1000, depth_count=4000, handshakes=9, oneway_count=6000)
QUICK = Plan(rounds=3, rtt_count=300, depth_count=1000, handshakes=3, oneway_count=2000)


# --- the parts ----------------------------------------------------------------------------------


class Bench:
    def __init__(self, plan: Plan, tmp: Path) -> None:
        self.plan = plan
        self.tmp = tmp
        self.server_id = Identity.generate()
        self.client_id = Identity.generate()
        self.server = IacServer(self.server_id)
        self.listeners: dict[str, Listener] = {}
        self.cleanup: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> None:
        on = self.server.on_connection
        self.quic_tickets = ServerTicketStore()
        self.listeners["quic"] = await listen_quic(
            "quic://127.0.0.1:0", self.server_id, on, config=CONFIG, tickets=self.quic_tickets
        )
        self.listeners["tls"] = await listen("tls://127.0.0.1:0", self.server_id, on, config=CONFIG)
        self.listeners["unix"] = await listen(
            f"unix://{self.tmp / 'iac.sock'}", self.server_id, on, config=CONFIG
        )
        self.echo_quic = await start_echo_quic()
        transport = self.echo_quic._transport
        assert transport is not None
        self.echo_quic_port = int(transport.get_extra_info("sockname")[1])
        cert = generate_self_signed("bench")
        self.echo_tls = await asyncio.start_server(tls_echo, "127.0.0.1", 0, ssl=server_context(cert, CONFIG))
        self.echo_tls_port = int(self.echo_tls.sockets[0].getsockname()[1])

    def url(self, name: str) -> str:
        return self.listeners[name].addresses[0]

    async def close(self) -> None:
        for fn in reversed(self.cleanup):
            with contextlib.suppress(Exception):
                await fn()
        for listener in self.listeners.values():
            await listener.close()
        self.echo_quic.close()
        self.echo_tls.close()

    # -- rtt --

    async def part_rtt(self) -> dict[str, Any]:
        plan = self.plan
        bq, bt = BareQuic(self.echo_quic_port), BareTls(self.echo_tls_port)
        await bq.connect()
        await bt.connect()
        clients: dict[str, Any] = {"bare aioquic echo": bq, "bare TLS echo": bt}
        for name in ("quic", "tls", "unix"):
            conn = await dial(self.url(name), self.client_id, expect=self.server_id.agent_id, config=CONFIG)
            clients[f"IAC-{name.upper()}"] = IacClient(conn, self.client_id, self.server_id.agent_id)
        figs: dict[str, dict[str, list[float]]] = {
            n: {"p50_us": [], "p99_us": [], "rps_64": []} for n in clients
        }
        for c in clients.values():  # warm-up
            await c.rtt(max(50, plan.rtt_count // 10))
            await c.depth(DEPTH * 4, DEPTH)
        for order in turn_order(list(clients), plan.rounds):
            for name in order:
                gc.collect()
                samples, f = await clients[name].rtt(plan.rtt_count), figs[name]
                f["p50_us"].append(median(samples))
                f["p99_us"].append(percentile(samples, 99))
                f["rps_64"].append(await clients[name].depth(plan.depth_count, DEPTH))
        for c in clients.values():
            await (c.conn.close() if isinstance(c, IacClient) else c.close())
        p50 = {name: f["p50_us"] for name, f in figs.items()}
        return {
            "rounds": plan.rounds,
            "round_trips_per_round": plan.rtt_count,
            "requests_per_round_at_64": plan.depth_count,
            "cases": {name: {k: summary(v) for k, v in f.items()} for name, f in figs.items()},
            # the round's own ratio (both ran back to back), median over rounds
            "ratio_quic": summary(per_round(p50["IAC-QUIC"], p50["bare aioquic echo"])),
            "ratio_tls": summary(per_round(p50["IAC-TLS"], p50["bare TLS echo"])),
        }

    # -- handshake --

    async def _first_delivery(self, url: str, *, tickets: ClientTicketStore | None = None) -> float:
        """Seconds from the start of dial to the server's recv() of the first message."""
        server = self.server
        while not server.firsts.empty():
            server.firsts.get_nowait()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if url.startswith("quic://"):
            conn: Connection = await dial_quic(
                url, self.client_id, expect=self.server_id.agent_id, config=CONFIG, tickets=tickets
            )
        else:
            conn = await dial(url, self.client_id, expect=self.server_id.agent_id, config=CONFIG)
        client = IacClient(conn, self.client_id, self.server_id.agent_id)
        await conn.send(client.request()[1])
        t1 = await asyncio.wait_for(server.firsts.get(), 5.0)
        await client.reply()  # the session is complete (a 0-RTT client stores its next ticket)
        if tickets is not None:
            await _until(lambda: url in tickets, 2.0)
        await conn.close()
        return t1 - t0

    async def part_handshake(self) -> dict[str, Any]:
        plan = self.plan
        urls = {"quic": self.url("quic"), "tls": self.url("tls"), "unix": self.url("unix")}
        relay = UdpRelay(host_port(urls["quic"]), Impairment(delay=ONE_WAY_DELAY))
        rhost, rport = await relay.start()
        self.cleanup.append(relay.close)
        proxy = TcpDelayProxy(host_port(urls["tls"]), ONE_WAY_DELAY)
        pport = await proxy.start()
        self.cleanup.append(proxy.close)
        far = {"quic": f"quic://{rhost}:{rport}", "tls": f"tls://127.0.0.1:{pport}"}
        stores = {"loopback": ClientTicketStore(), "20ms": ClientTicketStore()}
        kinds = (("QUIC 1-RTT", "quic", False), ("QUIC 0-RTT", "quic", True), ("TLS/TCP", "tls", False),
                 ("UNIX", "unix", False))  # fmt: skip
        cases = {
            f"{where} {what}": (where, at[key], early)
            for where, at in (("loopback", urls), ("20ms", far))
            for what, key, early in kinds
            if key in at
        }
        # prime the ticket stores (and warm up every path)
        for where, url, early in cases.values():
            await self._first_delivery(url, tickets=stores[where] if early else None)
        times: dict[str, list[float]] = {k: [] for k in cases}
        resumed = {k: 0 for k in cases if cases[k][2]}
        for order in turn_order(list(cases), plan.handshakes):
            for name in order:
                where, url, early = cases[name]
                store = stores[where] if early else None
                if store is not None and url not in store:
                    raise RuntimeError(f"{name}: no ticket stored for the 0-RTT dial")
                before = self.quic_tickets.resumed
                times[name].append(await self._first_delivery(url, tickets=store) * 1e3)
                if early and self.quic_tickets.resumed > before:
                    resumed[name] += 1
        return {
            "dials_per_case": plan.handshakes,
            "one_way_delay_ms": ONE_WAY_DELAY * 1e3,
            "cases_ms": {k: summary(v) for k, v in times.items()},
            "resumed": resumed,
        }

    # -- one-way --

    async def part_oneway(self) -> dict[str, Any]:
        plan = self.plan
        payloads = codec.load_payloads(codec.TEST)
        conn = await dial(self.url("quic"), self.client_id, expect=self.server_id.agent_id, config=CONFIG)
        client = IacClient(conn, self.client_id, self.server_id.agent_id)
        frames = [client.request(p, MessageType.BROADCAST)[1] for p in payloads]  # for the decode pass
        for f in frames:  # the decode pass must succeed on every frame
            decode_message_frame(f, dictionaries=DICTS)

        def decode(f: bytes) -> object:
            return decode_message_frame(f, dictionaries=DICTS)

        async def run(count: int, presigned: list[bytes] | None) -> float:
            server = self.server
            loop = asyncio.get_running_loop()
            server.oneway_target, server.oneway_seen = count, 0
            server.oneway_done = loop.create_future()
            t0 = loop.time()
            if presigned is not None:
                for frame in presigned:
                    await conn.send(frame)
            else:
                for i in range(count):
                    await conn.send(client.request(payloads[i % len(payloads)], MessageType.BROADCAST)[1])
            t1 = await asyncio.wait_for(server.oneway_done, 60.0)
            return count / (t1 - t0)

        def fresh(count: int) -> list[bytes]:
            """Frames signed ahead of the clock; new ones each round (the receiver refuses replays)."""
            return [
                client.request(payloads[i % len(payloads)], MessageType.BROADCAST)[1] for i in range(count)
            ]

        await run(min(1000, plan.oneway_count), fresh(min(1000, plan.oneway_count)))  # warm-up

        async def decoding() -> float:
            return codec.timed_pass(decode, frames)

        async def presigned() -> float:
            batch = fresh(plan.oneway_count)
            gc.collect()
            return await run(plan.oneway_count, batch)

        async def signing() -> float:
            gc.collect()
            return await run(plan.oneway_count, None)

        figs = await interleave_async({"d": decoding, "p": presigned, "s": signing}, plan.rounds, warmup=0)
        await conn.close()
        decode_rate = [1e6 / u for u in figs["d"]]
        return {
            "messages_per_round": plan.oneway_count,
            "payloads": len(payloads),
            "decode_us": summary(figs["d"]),
            "decode_rate": summary(decode_rate),
            "oneway_presigned_rate": summary(figs["p"]),
            "oneway_signing_rate": summary(figs["s"]),
            "ratio": summary(per_round(figs["p"], decode_rate)),
        }


def per_round(a: list[float], b: list[float]) -> list[float]:
    """Each round's ratio of ``a`` to ``b`` (they ran back to back)."""
    return [x / y for x, y in zip(a, b, strict=True)]


async def _until(cond: Callable[[], bool], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise RuntimeError("timed out waiting for a condition")
        await asyncio.sleep(0.001)


async def run(quick: bool, only: str) -> dict[str, Any]:
    """One part (``rtt``, ``handshake`` or ``oneway``) on the :data:`QUICK` or :data:`FULL` plan."""
    plan = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="iac-bench-") as tmp:
        bench = Bench(plan, Path(tmp))
        await bench.start()
        try:
            parts = {"rtt": bench.part_rtt, "handshake": bench.part_handshake}
            part = parts.get(only, bench.part_oneway)
            return {"quick": quick, "plan": plan.__dict__, only: await part()}
        finally:
            await bench.close()
