"""The ``filetransfer`` scenario's contenders: ``Node.send_file`` over QUIC, TLS/TCP and UNIX sockets,
and one bare aioquic (or qh3) stream whose server writes and hashes the bytes, nothing signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.transport.quic.backend import set_backend

#: The IAC-QUIC variants of the scenario: ``TransportConfig`` fields by label suffix.
LINK_VARIANTS: dict[str, dict[str, Any]] = {
    "PMTUD, GSO and ACK frequency off": {"quic_pmtud": False, "quic_gso": False, "quic_ack_frequency": False},
    "ACK frequency off": {"quic_ack_frequency": False},
    "GSO off": {"quic_gso": False},
    "up to 1,472-byte datagrams": {"quic_max_datagram_size": 1472},
}


def make_file(path: Path, mib: int, seed: int = 1) -> Path:
    """``mib`` MiB of incompressible bytes (seeded, so every contender sends the same file)."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(rng.randbytes(1 << 20))
    return path


@contextlib.contextmanager
def quic_backend(name: str | None) -> Iterator[None]:
    """Listeners and dials started inside use QUIC backend ``name``."""
    set_backend(name)
    try:
        yield
    finally:
        set_backend(None)


async def bench_iac_file(
    path: Path,
    workdir: Path,
    url: str = "quic://127.0.0.1:0",
    window: int | None = 16,
    backend: str | None = None,
    link: dict[str, Any] | None = None,
    report: dict[str, list[float]] | None = None,
) -> float:
    """MB/s of one ``Node.send_file`` (connection set up before the clock starts); the received
    file is checked for size and removed. ``link``: ``TransportConfig`` fields for both nodes;
    ``report`` (QUIC) gets the link figures the scenario shows (the keys it reads)."""
    from dataclasses import replace

    scheme = url.split(":", 1)[0]
    inbox = workdir / f"iac-inbox-{scheme}-{window}-{backend}"
    if scheme == "unix":
        url = f"unix://{workdir}/file-rx-{time.monotonic_ns()}.sock"
    cfg = NodeConfig(inbox_dir=inbox, max_file_size=1 << 34, durable_files=False)
    tx_cfg = NodeConfig()
    if link:
        cfg = replace(cfg, transport=replace(cfg.transport, **link))
        tx_cfg = replace(tx_cfg, transport=replace(tx_cfg.transport, **link))
    with quic_backend(backend if scheme == "quic" else None):
        async with Node(listen=[url], config=cfg) as rx, Node(config=tx_cfg) as tx:
            tx.add_peer(rx.agent_id, *rx.addresses)
            await tx.connect(rx.agent_id)
            conn = tx.connection(rx.agent_id)
            pmtu = getattr(conn, "path_mtu", None)
            until = time.monotonic() + 2.0  # the search takes a round trip or a few: let it finish first
            while pmtu is not None and pmtu.path.state == "searching" and time.monotonic() < until:
                await asyncio.sleep(0.01)
            hook = getattr(getattr(conn, "backend", None), "ack_counter", None)
            acks = hook(getattr(conn, "quic", None)) if hook is not None else None
            t0, c0 = time.perf_counter(), time.process_time()
            res = await tx.send_file(rx.agent_id, path, window=window)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            if report is not None and acks is not None:
                report.setdefault("ack_frames_per_mb", []).append(acks() / (res.size / 1e6))
            if report is not None and scheme == "quic":
                report.setdefault("datagram_bytes", []).append(pmtu.mtu if pmtu is not None else 1200)
                gso = getattr(getattr(conn, "gso", None), "stats", None)
                report.setdefault("gso_trains", []).append(gso.trains if gso is not None else 0)
                report.setdefault("gso_segments", []).append(gso.segments if gso is not None else 0)
                report.setdefault("cpu_s_per_mb", []).append(cpu / (res.size / 1e6))
    got = inbox / res.name
    try:
        if got.stat().st_size != res.size:
            raise RuntimeError(f"received {got.stat().st_size} bytes of {res.size}")
    finally:
        with contextlib.suppress(OSError):
            got.unlink()
    return res.size / seconds / 1e6


async def bench_bare_aioquic(path: Path, workdir: Path, lib: str = "aioquic", datagram: int = 1200) -> float:
    """MB/s of one QUIC stream (``lib``: ``aioquic`` or ``qh3``): the client reads the file onto it,
    the server writes it to disk and hashes it; ``datagram``: both sides' largest UDP payload."""
    import importlib

    aio = importlib.import_module(f"{lib}.asyncio")
    connect, serve = aio.connect, aio.serve
    QuicConnectionProtocol = importlib.import_module(f"{lib}.asyncio.protocol").QuicConnectionProtocol
    QuicConfiguration = importlib.import_module(f"{lib}.quic.configuration").QuicConfiguration
    StreamDataReceived = importlib.import_module(f"{lib}.quic.events").StreamDataReceived

    from iac.transport.certs import generate_self_signed

    cert = generate_self_signed("bench")
    (workdir / "c.pem").write_bytes(cert.cert_pem)
    (workdir / "k.pem").write_bytes(cert.key_pem)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out_path = workdir / f"bare-{lib}.bin"

    class Server(QuicConnectionProtocol):  # type: ignore[valid-type,misc]
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
    scfg.max_datagram_size = datagram
    scfg.load_cert_chain(str(workdir / "c.pem"), str(workdir / "k.pem"))
    server = await serve("127.0.0.1", 0, configuration=scfg, create_protocol=Server)
    port = server._transport.get_extra_info("sockname")[1]
    ccfg = QuicConfiguration(
        is_client=True,
        alpn_protocols=["bench"],
        verify_mode=ssl.CERT_NONE,
        max_stream_data=16 << 20,
        max_data=64 << 20,
        max_datagram_size=datagram,
    )
    try:
        async with connect("127.0.0.1", port, configuration=ccfg) as client:
            t0 = time.perf_counter()
            reader, writer = await client.create_stream()
            can_drain = getattr(writer, "_protocol", None) is not None  # qh3's stream writers have none
            with path.open("rb") as f:
                while block := f.read(256 * 1024):
                    writer.write(block)
                    if can_drain:
                        await writer.drain()
                    else:
                        await asyncio.sleep(0)
            writer.write_eof()
            await reader.read()
            await asyncio.wait_for(done, 60)
            seconds = time.perf_counter() - t0
    finally:
        server.close()
        with contextlib.suppress(OSError):
            out_path.unlink()
    return path.stat().st_size / seconds / 1e6
