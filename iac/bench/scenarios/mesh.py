"""Mesh benchmarks: broadcast completion, relayed vs direct requests, file transfer vs bare aioquic.

    .venv/bin/python -m iac.bench.scenarios.mesh [--quick] [--file-mib N] [--json OUT]

Broadcast completion (:class:`BroadcastBench`, also the suite's ``broadcast`` scenario),
DELEGATE_TASK requests/s through one relay vs direct, and ``Node.send_file`` vs one bare
aioquic stream; benchmarks/README.md, "Mesh" and "Suite" (broadcast)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines, brokers, common, endpoints
from iac.bench.contenders.baselines import dumps_compact
from iac.bench.harness.stats import median
from iac.bench.scenarios.filetransfer import bench_bare_aioquic, bench_iac_file, make_file
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.routing import RelayPolicy
from iac.wire._pb.iac_pb2 import Intent, MessageType
from iac.wire.task import TaskState

BROADCAST_PAYLOAD = {"event": "price-update", "symbol": "ACME", "price": 101.25, "source": "feed-7"}
#: Broadcast contenders: label -> method of :class:`BroadcastBench`.
IAC_MESH = "IAC broadcast (mesh flood)"
IAC_FANOUT = "IAC fan-out (N-1 sends)"
HTTP_ED25519 = "HTTP+Ed25519 JSON fan-out"
HTTP_SHA256 = "HTTP+JSON+SHA-256 fan-out"
NATS_FANOUT = "NATS subject fan-out"
NATS_ED25519 = "NATS+Ed25519 subject fan-out"
WAIT_S = 30.0  # longest a single broadcast may take before the round fails
SETTLE_ROUNDS = 500  # bound on the quiescence wait after a flood (10 ms each)


def graph(n: int, seed: int) -> list[tuple[int, int]]:
    """A connected graph: a random spanning tree plus ``n // 2`` extra links."""
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}
    target = min(n - 1 + n // 2, n * (n - 1) // 2)
    for _ in range(100 * n):
        if len(edges) >= target:
            break
        i, j = sorted(rng.sample(range(n), 2))
        edges.add((i, j))
    return sorted(edges)


class _Completion:
    """Counts the deliveries of the current key; resolves when the last agent got it."""

    def __init__(self) -> None:
        self.key = -1
        self.left = 0
        self.fut: asyncio.Future[float] | None = None

    def arm(self, key: int, count: int) -> asyncio.Future[float]:
        self.key, self.left = key, count
        self.fut = asyncio.get_running_loop().create_future()
        return self.fut

    def hit(self, key: int) -> None:
        if key != self.key or self.fut is None:
            return  # a late duplicate of an earlier round
        self.left -= 1
        if self.left == 0 and not self.fut.done():
            self.fut.set_result(time.perf_counter())


def http_body(payload: str, msg_id: int, signer: Any | None) -> bytes:
    """An HTTP fan-out's JSON envelope: hashed with the shared password, or signed (Ed25519)."""
    env = {"from": "agent-a", "to": "agent-b", "type": "RUN", "payload": payload, "msg_id": msg_id}
    env["timestamp"] = time.time_ns() // 1000
    if signer is None:
        return dumps_compact({**env, "hash": _sha(payload)}).encode()
    raw = dumps_compact(env)
    return dumps_compact({"envelope": raw, "sig": signer.sign(raw.encode()).signature.hex()}).encode()


def http_open(body: bytes, verifier: Any | None) -> dict[str, Any]:
    """The envelope of :func:`http_body`, its hash or signature checked."""
    obj: dict[str, Any] = json.loads(body)
    if verifier is not None:
        verifier.verify(obj["envelope"].encode(), bytes.fromhex(obj["sig"]))
        return dict(json.loads(obj["envelope"]))
    if obj.get("hash") != _sha(obj["payload"]):
        raise ValueError("bad hash")
    return obj


def _sha(payload: str) -> str:
    return hashlib.sha256((payload + baselines.HTTP_PASSWORD).encode()).hexdigest()


class BroadcastBench:
    """N agents reached from one origin, several ways (:meth:`contenders`), all in this process on
    UNIX sockets: ``await setup()``, then each contender returns one completion time in ms."""

    def __init__(self, n: int, workdir: Path, *, http: bool | None = None, seed: int | None = None) -> None:
        if n < 2:
            raise ValueError("a broadcast needs at least two agents")
        self.n = n
        self.dir = workdir
        self.http = endpoints.have_aiohttp() if http is None else http
        self.edges = graph(n, seed=n if seed is None else seed)
        self.key = 0
        self.done = _Completion()
        self.mesh: list[Node] = []
        self.star: list[Node] = []
        self._http_runners: list[Any] = []
        self._http_sessions: list[Any] = []
        self._cleanups: list[Callable[[], Awaitable[None]]] = []
        self.nats = brokers.NatsFanout(n, self.done.hit) if brokers.missing("nats") is None else None

    def contenders(self) -> dict[str, Callable[[], Awaitable[float]]]:
        out: dict[str, Callable[[], Awaitable[float]]] = {
            IAC_MESH: self.iac_mesh,
            IAC_FANOUT: self.iac_fanout,
        }
        if self.http:
            out[HTTP_ED25519] = lambda: self.http_fanout(signed=True)
            out[HTTP_SHA256] = lambda: self.http_fanout(signed=False)
        if self.nats is not None:
            out[NATS_ED25519] = lambda: self.nats_fanout(signed=True)
            out[NATS_FANOUT] = lambda: self.nats_fanout(signed=False)
        return out

    async def nats_fanout(self, signed: bool) -> float:
        nats = self.nats
        assert nats is not None
        return await self._completion(lambda key, payload: nats.publish(key, payload, signed))

    # --- set-up ------------------------------------------------------------------------------

    async def setup(self) -> None:
        # fair_share off: the N agents share one event loop here, where its lag is everybody's
        # (a node would hold a neighbour back for load that is not its own)
        cfg = NodeConfig(broadcast_hop_limit=64, sync_in_thread=False, fair_share=False)
        self.mesh = [Node(listen=[f"unix://{self.dir}/m{i}.sock"], config=cfg) for i in range(self.n)]
        self.star = [Node(listen=[f"unix://{self.dir}/s{i}.sock"], config=cfg) for i in range(self.n)]
        for node in (*self.mesh, *self.star):
            await node.start()
            node.on(MessageType.BROADCAST)(self._on_iac)
        for i, j in self.edges:
            self.mesh[i].add_peer(self.mesh[j].agent_id, *self.mesh[j].addresses)
        await asyncio.gather(*(self.mesh[i].connect(self.mesh[j].agent_id) for i, j in self.edges))
        hub = self.star[0]
        for leaf in self.star[1:]:
            hub.add_peer(leaf.agent_id, *leaf.addresses)
        await asyncio.gather(*(hub.connect(leaf.agent_id) for leaf in self.star[1:]))
        deg = [0] * self.n
        for i, j in self.edges:
            deg[i] += 1
            deg[j] += 1
        for _ in range(3000):  # both ends of every link registered (10 ms steps, 30 s at most)
            if all(nd.stats().connections >= deg[i] for i, nd in enumerate(self.mesh)):
                break
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("the mesh did not connect within 30 s")
        if self.http:
            await self._setup_http()
        if self.nats is not None:
            await self.nats.setup()

    def _on_iac(self, ctx: Context) -> None:
        self.done.hit(int(ctx.payload["k"]))

    async def _setup_http(self) -> None:
        import aiohttp
        from aiohttp import web

        _, verify_origin = brokers.keys(True, common.SERVER_SEED, common.CLIENT_SEED)

        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            signed = request.headers.get("X-Signed") == "1"
            env = http_open(body, verify_origin if signed else None)
            self.done.hit(int(json.loads(env["payload"])["k"]))
            return web.Response(status=204)

        for i in range(1, self.n):
            app = web.Application()
            app.router.add_post(baselines.HTTP_PATH, handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.UnixSite(runner, str(self.dir / f"h{i}.sock")).start()
            self._http_runners.append(runner)
            self._http_sessions.append(
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=str(self.dir / f"h{i}.sock"), limit=1),
                    timeout=aiohttp.ClientTimeout(total=WAIT_S),
                )
            )
        self._origin_signer, _ = brokers.keys(True, common.CLIENT_SEED, common.SERVER_SEED)

    async def close(self) -> None:
        for s in self._http_sessions:
            with contextlib.suppress(Exception):
                await s.close()
        for r in self._http_runners:
            with contextlib.suppress(Exception):
                await r.cleanup()
        for node in (*self.mesh, *self.star):
            with contextlib.suppress(Exception):
                await node.close()
        if self.nats is not None:
            await self.nats.close()

    # --- contenders --------------------------------------------------------------------------

    async def _completion(self, send: Callable[[int, dict[str, Any]], Awaitable[object]]) -> float:
        """ms from ``send(key, payload)``'s call to the handler of the last of the N-1 agents."""
        self.key += 1
        key, payload = self.key, {**BROADCAST_PAYLOAD, "k": self.key}
        fut = self.done.arm(key, self.n - 1)
        t0 = time.perf_counter()
        await send(key, payload)
        return (await asyncio.wait_for(fut, WAIT_S) - t0) * 1e3

    async def _settle(self) -> None:
        """Wait until the flood's late duplicates stop arriving (so the next turn runs on a quiet loop)."""
        last = -1
        for _ in range(SETTLE_ROUNDS):
            now = sum(nd.stats().received for nd in self.mesh)
            if now == last:
                return
            last = now
            await asyncio.sleep(0.01)

    def sent_bytes(self) -> int:
        """IAC frame bytes sent by every node so far (mesh and star)."""
        return sum(nd.stats().bytes_sent for nd in (*self.mesh, *self.star))

    async def iac_mesh(self) -> float:
        ms = await self._completion(
            lambda key, payload: self.mesh[(key * 7) % self.n].broadcast(MessageType.BROADCAST, payload)
        )
        await self._settle()
        return ms

    async def iac_fanout(self) -> float:
        hub = self.star[0]
        return await self._completion(
            lambda _key, payload: asyncio.gather(
                *(hub.send(leaf.agent_id, MessageType.BROADCAST, payload) for leaf in self.star[1:])
            )
        )

    async def http_fanout(self, signed: bool) -> float:
        headers = {"Content-Type": "application/json", "X-Signed": "1" if signed else "0"}

        async def post(session: Any, body: bytes) -> None:
            async with session.post(
                f"http://localhost{baselines.HTTP_PATH}", data=body, headers=headers
            ) as resp:
                if resp.status != 204:
                    raise RuntimeError(f"HTTP {resp.status}")

        def send(key: int, payload: dict[str, Any]) -> Awaitable[object]:
            # one body for every agent (signed or hashed once): the cheapest an HTTP sender can do
            body = http_body(json.dumps(payload), key, self._origin_signer if signed else None)
            return asyncio.gather(*(post(s, body) for s in self._http_sessions))

        return await self._completion(send)


async def bench_broadcast(n: int, rounds: int) -> dict[str, Any]:
    """Flood completion alone (``mesh.py`` main): median and max over ``rounds`` broadcasts."""
    d = Path(tempfile.mkdtemp(prefix="iacbm-"))
    bench = BroadcastBench(n, d, http=False)
    try:
        await bench.setup()
        await bench.iac_mesh()  # warm-up
        times = [await bench.iac_mesh() for _ in range(rounds)]
        return {
            "nodes": n,
            "links": len(bench.edges),
            "median_ms": median(times),
            "max_ms": max(times),
        }
    finally:
        await bench.close()
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
        task = TaskState(task_id="t-1", intent=Intent.ASSIGN_TASK, step=1, steps=1)
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


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds and a smaller file")
    ap.add_argument("--file-mib", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rounds = 3 if args.quick else 10
    mib = args.file_mib or (16 if args.quick else 128)
    broadcasts = [await bench_broadcast(n, rounds) for n in (10, 50, 100)]
    results: dict[str, Any] = {"broadcast": broadcasts}
    results["relay"] = await bench_relay(1000 if args.quick else 5000)
    work = Path(tempfile.mkdtemp(prefix="iacfm-"))
    try:
        src = make_file(work / "payload.bin", mib)
        results["file"] = {"mib": mib, "bare_aioquic_mb_s": await bench_bare_aioquic(src, work)}
        for url, window in (("quic://127.0.0.1:0", 8), ("quic://127.0.0.1:0", 16), ("tls://127.0.0.1:0", 16)):
            rate = await bench_iac_file(src, work, url, window)
            results["file"][f"iac_{url.split(':', 1)[0]}_window{window}_mb_s"] = rate
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from iac.bench.reports.live import print_rendered

    print_rendered(("mesh-results",), "iac.bench.scenarios.mesh", results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
