"""Mesh benchmarks: broadcast completion, relayed vs direct requests, file transfer vs bare aioquic.

    .venv/bin/python benchmarks/mesh.py [--quick] [--file-mib N] [--json OUT]

* Broadcast completion: N nodes (10, 50, 100) in this one process, on UNIX
  sockets, in a seeded random connected graph (a spanning tree plus N/2 extra
  links); the time from ``broadcast()`` to the last node's handler, median of
  several broadcasts from different origins.
* Delegation through one relay vs direct: DELEGATE_TASK requests/s from A to C
  with 32 in flight, A—C directly and A—B—C with B relaying (TLS on loopback).
* File transfer: ``Node.send_file`` over QUIC on loopback vs a bare aioquic
  single-stream transfer of the same file (client reads the file onto one
  stream; server writes it to disk and hashes it), in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from iac._node import Context, Node  # noqa: E402
from iac._node_config import NodeConfig  # noqa: E402
from iac._pb.iac_pb2 import Intent, MessageType, TaskState  # noqa: E402
from iac._routing import RelayPolicy  # noqa: E402


def graph(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}
    while len(edges) < n - 1 + n // 2:
        i, j = sorted(rng.sample(range(n), 2))
        edges.add((i, j))
    return sorted(edges)


async def bench_broadcast(n: int, rounds: int) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="iacbm-")
    cfg = NodeConfig(broadcast_hop_limit=64, sync_in_thread=False)
    nodes = [Node(listen=[f"unix://{d}/{i}.sock"], config=cfg) for i in range(n)]
    try:
        for node in nodes:
            await node.start()
        pending: dict[int, int] = {}
        done: dict[int, asyncio.Future[float]] = {}
        for node in nodes:

            def on_b(ctx: Context) -> None:
                k = ctx.payload
                pending[k] -= 1
                if pending[k] == 0:
                    done[k].set_result(time.perf_counter())

            node.on(MessageType.BROADCAST)(on_b)
        edges = graph(n, seed=n)
        await asyncio.gather(*(nodes[i].connect(nodes[j].agent_id) for i, j in edges if not
                               nodes[i].add_peer(nodes[j].agent_id, *nodes[j].addresses)))  # fmt: skip
        deg = [0] * n
        for i, j in edges:
            deg[i] += 1
            deg[j] += 1
        while any(nd.stats().connections < deg[i] for i, nd in enumerate(nodes)):
            await asyncio.sleep(0.01)
        times = []
        loop = asyncio.get_running_loop()
        for k in range(rounds):
            pending[k] = n - 1
            done[k] = loop.create_future()
            t0 = time.perf_counter()
            await nodes[(k * 7) % n].broadcast(MessageType.BROADCAST, k)
            t1 = await asyncio.wait_for(done[k], 30)
            times.append((t1 - t0) * 1000)
        return {"nodes": n, "links": len(edges), "median_ms": statistics.median(times), "max_ms": max(times)}
    finally:
        for node in nodes:
            await node.close()
        shutil.rmtree(d, ignore_errors=True)


async def bench_relay(requests: int, concurrency: int = 32) -> dict[str, Any]:
    relay_cfg = NodeConfig(relay_policy=RelayPolicy(relay_unicast=True), sync_in_thread=False)
    async with (
        Node(listen=["tls://127.0.0.1:0"], config=NodeConfig(sync_in_thread=False)) as c,
        Node(listen=["tls://127.0.0.1:0"], config=relay_cfg) as b,
        Node() as a,
    ):
        c.on(MessageType.DELEGATE_TASK)(lambda ctx: {"accepted": ctx.task.task_id if ctx.task else ""})
        b.add_peer(c.agent_id, *c.addresses)
        await b.connect(c.agent_id)
        a.add_peer(b.agent_id, *b.addresses)
        a.add_peer(c.agent_id, *c.addresses)
        await a.connect(b.agent_id)
        task = TaskState(task_id="t-1", intent=Intent.ASSIGN_TASK, step=1, steps=1)  # type: ignore[arg-type]
        out: dict[str, Any] = {}
        for label, via in (("direct", None), ("via_relay", b.agent_id)):
            sem = asyncio.Semaphore(concurrency)

            async def one(via: str | None = via, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    await a.request(
                        c.agent_id, MessageType.DELEGATE_TASK, {"q": 1}, task=task, via=via, timeout=10
                    )

            await asyncio.gather(*(one() for _ in range(200)))  # warm up
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(requests)))
            out[label] = requests / (time.perf_counter() - t0)
        out["ratio"] = out["via_relay"] / out["direct"]
        return out


async def bench_iac_file(
    path: Path, workdir: Path, url: str = "quic://127.0.0.1:0", window: int = 16
) -> float:
    inbox = workdir / f"iac-inbox-{url[:4]}-{window}"
    cfg = NodeConfig(inbox_dir=inbox, max_file_size=1 << 34, durable_files=False)
    async with Node(listen=[url], config=cfg) as rx, Node() as tx:
        tx.add_peer(rx.agent_id, *rx.addresses)
        await tx.connect(rx.agent_id)
        t0 = time.perf_counter()
        res = await tx.send_file(rx.agent_id, path, window=window)
        seconds = time.perf_counter() - t0
        assert (inbox / res.name).stat().st_size == res.size
        return res.size / seconds / 1e6


async def bench_bare_aioquic(path: Path, workdir: Path) -> float:
    """One QUIC stream: the client reads the file onto it; the server writes it to disk and hashes it."""
    from aioquic.asyncio import connect, serve
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import StreamDataReceived

    from iac._certs import generate_self_signed

    cert = generate_self_signed("bench")
    (workdir / "c.pem").write_bytes(cert.cert_pem)
    (workdir / "k.pem").write_bytes(cert.key_pem)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out_path = workdir / "bare.bin"

    class Server(QuicConnectionProtocol):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.f = out_path.open("wb")
            self.h = hashlib.sha256()

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, StreamDataReceived):
                self.f.write(event.data)
                self.h.update(event.data)
                if event.end_stream:
                    self.f.close()
                    self._quic.send_stream_data(event.stream_id, b"ok", end_stream=True)
                    self.transmit()
                    if not done.done():
                        done.set_result(self.h.hexdigest())

    scfg = QuicConfiguration(
        is_client=False, alpn_protocols=["bench"], max_stream_data=16 << 20, max_data=64 << 20
    )
    scfg.load_cert_chain(str(workdir / "c.pem"), str(workdir / "k.pem"))
    server = await serve("127.0.0.1", 0, configuration=scfg, create_protocol=Server)
    port = server._transport.get_extra_info("sockname")[1]
    ccfg = QuicConfiguration(is_client=True, alpn_protocols=["bench"], verify_mode=ssl.CERT_NONE,
                             max_stream_data=16 << 20, max_data=64 << 20)  # fmt: skip
    try:
        async with connect("127.0.0.1", port, configuration=ccfg) as client:
            t0 = time.perf_counter()
            reader, writer = await client.create_stream()
            with path.open("rb") as f:
                while block := f.read(256 * 1024):
                    writer.write(block)
                    await writer.drain()
            writer.write_eof()
            await reader.read()
            await asyncio.wait_for(done, 60)
            seconds = time.perf_counter() - t0
    finally:
        server.close()
    return path.stat().st_size / seconds / 1e6


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds and a smaller file")
    ap.add_argument("--file-mib", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rounds = 3 if args.quick else 10
    mib = args.file_mib or (16 if args.quick else 128)
    results: dict[str, Any] = {"broadcast": []}
    for n in (10, 50, 100):
        r = await bench_broadcast(n, rounds)
        results["broadcast"].append(r)
        print(f"broadcast {n:3d} nodes ({r['links']} links): last node after {r['median_ms']:.1f} ms median "
              f"(max {r['max_ms']:.1f} ms)", flush=True)  # fmt: skip
    r = await bench_relay(1000 if args.quick else 5000)
    results["relay"] = r
    print(f"delegation: direct {r['direct']:.0f} req/s, through one relay {r['via_relay']:.0f} req/s "
          f"({r['ratio']:.2f}x)", flush=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="iacfm-"))
    try:
        src = work / "payload.bin"
        with src.open("wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        bare = await bench_bare_aioquic(src, work)
        results["file"] = {"mib": mib, "bare_aioquic_mb_s": bare}
        print(f"file transfer {mib} MiB: bare aioquic single stream {bare:.1f} MB/s", flush=True)
        for url, window in (("quic://127.0.0.1:0", 8), ("quic://127.0.0.1:0", 16), ("tls://127.0.0.1:0", 16)):
            rate = await bench_iac_file(src, work, url, window)
            results["file"][f"iac_{url.split(':', 1)[0]}_window{window}_mb_s"] = rate
            scheme = url.split(":", 1)[0]
            print(f"  iac send_file over {scheme}, window {window}: {rate:.1f} MB/s "
                  f"({rate / bare:.2f}x bare aioquic)", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
