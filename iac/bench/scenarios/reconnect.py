"""First delivery after a reconnect, through the Node API, at 20 ms RTT: QUIC 0-RTT vs QUIC 1-RTT
vs TLS/TCP (``iac bench --only reconnect``).

Each contender is a client Node that already spoke to the server once (a QUIC client holds a
ticket), then lost its connection; the figure is the time from ``node.request(...)`` to the
server's handler, through a UDP relay or TCP proxy adding 10 ms each way. Target: QUIC 0-RTT
<= 0.6 x QUIC 1-RTT."""

from __future__ import annotations

import asyncio
from typing import Any

from iac.bench.contenders.echo import TcpDelayProxy
from iac.bench.harness.counting import host_port
from iac.bench.harness.results import summarize, turn_order
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.testing import Impairment, UdpRelay

ONE_WAY_DELAY = 0.010
TARGET_0RTT = 0.6
CONTENDERS = ("QUIC 0-RTT", "QUIC 1-RTT", "TLS/TCP")


async def measure(rounds: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue[float] = asyncio.Queue()
    async with Node(listen=["quic://127.0.0.1:0", "tls://127.0.0.1:0"]) as server:

        def handler(ctx: object) -> str:
            arrived.put_nowait(loop.time())
            return "ok"

        server.on("RUN")(handler)
        quic, tls = server.addresses[0], server.addresses[1]
        relay = UdpRelay(host_port(quic), Impairment(delay=ONE_WAY_DELAY))
        rhost, rport = await relay.start()
        proxy = TcpDelayProxy(host_port(tls), ONE_WAY_DELAY)
        pport = await proxy.start()
        far_quic = f"quic://{rhost}:{rport}"
        urls = {"QUIC 0-RTT": far_quic, "QUIC 1-RTT": far_quic, "TLS/TCP": f"tls://127.0.0.1:{pport}"}
        clients = {name: Node(config=NodeConfig(zero_rtt=name == "QUIC 0-RTT")) for name in CONTENDERS}
        times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        resumed = 0
        try:
            for name, client in clients.items():
                await client.start()
                client.add_peer(server.agent_id, urls[name])
                await _first_delivery(client, server.agent_id, arrived)  # warm up; a ticket for QUIC
            for order in turn_order(CONTENDERS, rounds):
                for name in order:
                    client = clients[name]
                    times[name].append(await _first_delivery(client, server.agent_id, arrived) * 1e3)
                    conn = client.connection(server.agent_id)
                    if name == "QUIC 0-RTT" and conn is not None and conn.peer.resumed:
                        resumed += 1
        finally:
            for client in clients.values():
                await client.close()
            await relay.close()
            await proxy.close()
    figs = {name: summarize(v) for name, v in times.items()}
    med = {name: f["median"] for name, f in figs.items()}
    return {
        "rounds": rounds,
        "one_way_delay_ms": ONE_WAY_DELAY * 1e3,
        "first_delivery_ms": figs,
        "resumed": resumed,
        "ratio_0rtt_1rtt": med["QUIC 0-RTT"] / med["QUIC 1-RTT"],
        "ratio_0rtt_tls": med["QUIC 0-RTT"] / med["TLS/TCP"],
        "target_0rtt_1rtt": TARGET_0RTT,
    }


async def _first_delivery(client: Node, server: str, arrived: asyncio.Queue[float]) -> float:
    """Drop the client's connection, then time request -> the server's handler."""
    conn = client.connection(server)
    if conn is not None:
        await conn.close()
        while client.connected(server):
            await asyncio.sleep(0.001)
    while not arrived.empty():
        arrived.get_nowait()
    t0 = asyncio.get_running_loop().time()
    await client.request(server, "RUN", timeout=10)
    took = (await arrived.get()) - t0
    if client.config.zero_rtt:  # a QUIC 0-RTT client keeps the next ticket for its next reconnect
        loop = asyncio.get_running_loop()
        deadline = t0 + 5
        while client.stats().peer_state["session_tickets"] == 0 and loop.time() < deadline:
            await asyncio.sleep(0.005)
    return took


def scenario(ctx: Any, res: Any) -> None:
    """``iac bench --only reconnect``: the measurement, its figures as the suite's rows."""
    data = asyncio.run(measure(5 if ctx.quick else 30))
    res.baseline = "QUIC 1-RTT"
    for name, f in data["first_delivery_ms"].items():
        res.add(name, "first delivery after a reconnect, 20 ms RTT (Node API)", "ms", f, iac=True)
    res.notes.append(
        f"scenarios/reconnect.py: {data['rounds']} rounds, contenders taking turns; a client Node drops "
        "its connection, then node.request() dials again (from its peer book) and the figure is the time "
        f"until the server's handler has the request. 0-RTT / 1-RTT = {data['ratio_0rtt_1rtt']:.2f} "
        f"(target <= {TARGET_0RTT}); 0-RTT dials that resumed: {data['resumed']}/{data['rounds']}."
    )
    res.raw = data
