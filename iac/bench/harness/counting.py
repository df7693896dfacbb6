"""Counting the bytes a contender puts on the socket: a TCP/UNIX proxy and a UDP relay that count."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

# --- counting the bytes at the socket ----------------------------------------------------------


class CountingProxy:
    """A stream relay (TCP or UNIX) that counts the bytes each side writes.

    ``target`` is ``("tcp", host, port)`` or ``("unix", path)``; the proxy listens on the same
    kind of socket (``listen_path`` for UNIX). ``up`` = client → server bytes, ``down`` =
    server → client bytes.
    """

    def __init__(self, target: tuple[Any, ...], listen_path: str | None = None) -> None:
        self.target = target
        self.listen_path = listen_path
        self.up = 0
        self.down = 0
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> tuple[Any, ...]:
        """Listen; return the address to dial: ``("tcp", host, port)`` or ``("unix", path)``."""
        if self.target[0] == "unix":
            if self.listen_path is None:
                raise ValueError("a UNIX proxy needs listen_path")
            self._server = await asyncio.start_unix_server(self._accept, path=self.listen_path)
            return ("unix", self.listen_path)
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return ("tcp", "127.0.0.1", self._server.sockets[0].getsockname()[1])

    @property
    def total(self) -> int:
        return self.up + self.down

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.target[0] == "unix":
            ur, uw = await asyncio.open_unix_connection(self.target[1])
        else:
            ur, uw = await asyncio.open_connection(self.target[1], self.target[2])
        self._writers += [writer, uw]
        await asyncio.gather(self._pump(reader, uw, True), self._pump(ur, writer, False))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        try:
            while data := await reader.read(65536):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            with contextlib.suppress(Exception):
                w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)


def host_port(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``scheme://host:port[/]`` or ``host:port``."""
    host, port = url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
    return host.strip("[]"), int(port)


async def relay_for(url: str, listen_path: str) -> tuple[Any, tuple[Any, ...]]:
    """A counting relay started in front of ``url`` (``quic://``: UDP; ``unix://``; else TCP) and
    the address to dial instead: ``("udp"|"tcp", host, port)`` or ``("unix", path)``."""
    if url.startswith("quic://"):
        relay = counting_udp_relay(host_port(url))
        return relay, ("udp", *await relay.start())
    unix = url.startswith("unix://")
    proxy = CountingProxy(
        ("unix", url.removeprefix("unix://")) if unix else ("tcp", *host_port(url)), listen_path
    )
    return proxy, await proxy.start()


def counting_udp_relay(target: tuple[str, int]) -> Any:
    """An ``iac.testing.relay.UdpRelay`` with no impairment that sums the UDP payload bytes it forwards."""
    from iac.testing.relay import UdpRelay

    class CountingUdpRelay(UdpRelay):
        up = 0
        down = 0

        @property
        def total(self) -> int:
            return self.up + self.down

        def _send(self, via: Any, data: bytes, dest: Any) -> None:
            if via is self._listen:
                self.down += len(data)
            else:
                self.up += len(data)
            super()._send(via, data, dest)

    return CountingUdpRelay(target)
