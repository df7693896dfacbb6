"""A small HTTP endpoint on the event loop that serves one Prometheus registry (``GET /metrics``).

It binds its socket at once (so the port is known, and taken, when :meth:`ScrapeServer.start`
returns) and serves on the running loop: a scrape reads ``node.stats()`` on the loop's thread,
between two steps of the node, never beside it. Requests are bounded: the head at most
:data:`MAX_HEAD` bytes within :data:`READ_TIMEOUT` seconds, at most :data:`MAX_CLIENTS` at once and
at most :data:`MAX_PER_ADDRESS` of them from one client address (so one client holding idle
sockets leaves the other slots to other scrapers); a connection over a bound is closed unanswered,
counted in :attr:`ScrapeServer.refused` and logged at most once per 10 s with the count. Every
response closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from iac.errors import ConfigError
from iac.integrations.slots import AddressSlots, RefusalLog

log = logging.getLogger("iac.integrations")

#: The largest request head (request line and headers) read, in bytes.
MAX_HEAD = 8 * 1024
#: Seconds a client has to send its request head.
READ_TIMEOUT = 10.0
#: Connections served at once; more are closed unanswered.
MAX_CLIENTS = 16
#: Connections served at once from one client address; more from it are closed unanswered.
MAX_PER_ADDRESS = 4

#: What renders the page: the value of the request's Accept header in, (body, content type) out.
Render = Callable[[str], tuple[bytes, str]]


def parse_listen(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:9464"``, ``":9464"`` = every address) as ``(host, port)``."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"a metrics address is HOST:PORT, not {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)


def _response(status: str, body: bytes, content_type: str, head_only: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


class ScrapeServer:
    """Serves ``render`` at ``/metrics`` (and ``/``) on ``host:port`` until :meth:`close`."""

    def __init__(self, host: str, port: int, render: Render) -> None:
        self._host = host
        self._port = port
        self._render = render
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._slots = AddressSlots(MAX_CLIENTS, MAX_PER_ADDRESS)
        self._refusals = RefusalLog(log, f"metrics endpoint {host}:{port}")

    @property
    def refused(self) -> dict[str, int]:
        """Connections closed unanswered, by bound (``per_address``, ``total``)."""
        return dict(self._slots.refused)

    @property
    def address(self) -> tuple[str, int]:
        """The address it listens on (the port chosen when it was 0)."""
        if self._sock is None:
            raise ConfigError("the metrics endpoint is not started")
        name = self._sock.getsockname()
        return str(name[0]), int(name[1])

    def start(self) -> None:
        """Bind and listen now; serve on the running loop from its next step."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            sock = socket.create_server((self._host, self._port), family=family, backlog=MAX_CLIENTS)
        except OSError as exc:
            raise ConfigError(f"metrics endpoint: cannot listen on {self._host}:{self._port}: {exc}") from exc
        sock.setblocking(False)
        self._sock = sock
        self._task = loop.create_task(self._serve(sock), name="iac-metrics-http")

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._on_client, sock=sock, limit=MAX_HEAD)
        await self._server.serve_forever()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else ""
        refused = self._slots.take(address)
        if refused is not None:
            loop = asyncio.get_running_loop()
            due = self._refusals.refused(refused, loop.time())
            if due is not None:  # the count since the last line is logged when the interval ends
                loop.call_at(due, lambda: self._refusals.flush(loop.time()))
            writer.transport.abort()
            return
        self._clients.add(writer)
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(self._answer(head))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            self._slots.give(address)
            self._clients.discard(writer)
            writer.close()

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return _response("400 Bad Request", b"bad request\n", "text/plain", False)
        method, target = parts[0], parts[1]
        head_only = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"GET only\n", "text/plain", False)
        if target.split("?", 1)[0] not in ("/metrics", "/"):
            return _response("404 Not Found", b"see /metrics\n", "text/plain", head_only)
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        body, content_type = self._render(accept)
        return _response("200 OK", body, content_type, head_only)

    def close(self) -> None:
        """Stop listening and drop the connections being served (the port is free on return)."""
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()
        if self._task is not None:
            self._task.cancel()
        for writer in list(self._clients):
            with contextlib.suppress(Exception):
                writer.close()
        self._clients.clear()


__all__ = ["MAX_CLIENTS", "MAX_HEAD", "MAX_PER_ADDRESS", "READ_TIMEOUT", "ScrapeServer", "parse_listen"]
