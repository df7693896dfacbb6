"""A small UDP impairment relay for tests and benchmarks.

The relay listens on one UDP port and forwards every datagram to a fixed
target, like a NAT: each client address gets its own upstream socket, and the
target's answers go back to that client. Each direction can add delay,
jitter, loss, reordering and duplication, drawn from a seeded random
generator so that a run can be repeated. Queues are bounded (a datagram that
would exceed ``max_queue`` in flight is dropped and counted), and
:class:`RelayStats` says what was forwarded, dropped, duplicated and
reordered.

For replay tests the relay can capture client-to-target datagrams
(:meth:`UdpRelay.start_capture`) and send captured datagrams to the target
again from a fresh source port (:meth:`UdpRelay.replay`).

Example::

    relay = UdpRelay(("127.0.0.1", server_port), Impairment(delay=0.01, loss=0.05, seed=1))
    host, port = await relay.start()
    ... dial quic://host:port ...
    await relay.close()
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import cast

from iac.errors import ConfigError

Address = tuple[str, int]


#: Bytes an IPv4 header and a UDP header add to a datagram's payload.
UDP_IPV4_OVERHEAD = 28


@dataclass(frozen=True)
class Impairment:
    """What the relay does to each datagram in one direction.

    ``delay`` and ``jitter`` are seconds (the delay of one datagram is
    ``delay + uniform(0, jitter)``); ``loss``, ``reorder`` and ``duplicate``
    are probabilities. A reordered datagram is held back by an extra
    ``reorder_delay`` so that later ones overtake it. ``mtu`` (bytes, None: no
    limit) silently drops every packet larger than it, as a path whose MTU is
    ``mtu`` drops packets with Don't Fragment set: the link emulator compares it with
    the IP packet, this relay with the UDP payload plus 28 bytes (IPv4 and UDP
    headers), so that one value means the same path on both.
    """

    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.005
    duplicate: float = 0.0
    mtu: int | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "reorder", "duplicate"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"{name} is a probability in [0, 1], got {p}")
        for name in ("delay", "jitter", "reorder_delay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.mtu is not None and self.mtu < UDP_IPV4_OVERHEAD + 1:
            raise ConfigError(f"mtu must be more than {UDP_IPV4_OVERHEAD} bytes, got {self.mtu}")


@dataclass
class RelayStats:
    """Counts per relay, both directions together."""

    received: int = 0
    forwarded: int = 0
    dropped_loss: int = 0
    dropped_queue: int = 0
    dropped_mtu: int = 0
    #: The largest datagram forwarded, and how many were larger than QUIC's 1,200 bytes.
    largest_forwarded: int = 0
    forwarded_large: int = 0
    duplicated: int = 0
    reordered: int = 0
    replayed: int = 0


@dataclass(frozen=True)
class Captured:
    """One client-to-target datagram as the relay saw it."""

    client: Address
    data: bytes


class _Leg(asyncio.DatagramProtocol):
    """A socket of the relay; hands every datagram to a callback."""

    def __init__(self, relay: UdpRelay, upstream_of: Address | None) -> None:
        self.relay = relay
        self.upstream_of = upstream_of  # None: the listening socket
        self.transport: asyncio.DatagramTransport | None = None
        self.backlog: list[bytes] = []  # client datagrams that came while the socket opened

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Address) -> None:
        if self.upstream_of is None:
            self.relay.from_client(data, addr)
        elif self.upstream_of != _REPLAY:
            self.relay.from_target(data, self.upstream_of)


_REPLAY: Address = ("replay", 0)


@dataclass
class _Direction:
    impairment: Impairment
    in_flight: int = 0


@dataclass
class UdpRelay:
    """A seeded UDP relay between clients and one ``target`` address."""

    target: Address
    upstream: Impairment = field(default_factory=Impairment)  # client -> target
    downstream: Impairment | None = None  # target -> client; None: same as upstream
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 0
    max_queue: int = 4096
    max_clients: int = 256

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.max_clients < 1:
            raise ConfigError("max_queue and max_clients must be positive")
        self.stats = RelayStats()
        self.captured: list[Captured] = []
        self._capturing = False
        self._capture_limit = 0
        self._rng = random.Random(self.seed)
        self._up = _Direction(self.upstream)
        self._down = _Direction(self.downstream or self.upstream)
        self._listen: _Leg | None = None
        self._clients: dict[Address, _Leg] = {}
        self._pending: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> Address:
        """Bind the listening socket; return its ``(host, port)``."""
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_datagram_endpoint(
            lambda: _Leg(self, None), local_addr=(self.host, self.port)
        )
        self._listen = proto
        sock = proto.transport.get_extra_info("sockname") if proto.transport else None
        if sock is None:
            raise ConfigError("relay socket did not bind")
        self.address: Address = (sock[0], sock[1])
        return self.address

    def set_impairment(self, upstream: Impairment, downstream: Impairment | None = None) -> None:
        """Change the impairment from now on (datagrams already queued keep theirs)."""
        self._up.impairment = upstream
        self._down.impairment = downstream or upstream

    def start_capture(self, limit: int = 64) -> None:
        """Record the next ``limit`` client-to-target datagrams in :attr:`captured`."""
        self.captured = []
        self._capturing = True
        self._capture_limit = limit

    def stop_capture(self) -> list[Captured]:
        self._capturing = False
        return list(self.captured)

    async def replay(self, datagrams: list[Captured]) -> None:
        """Send captured datagrams to the target again, from a fresh source port.

        Answers to the replayed datagrams are discarded (an attacker that replays
        cannot read them anyway).
        """
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Leg(self, _REPLAY), local_addr=(self.host, 0)
        )
        try:
            for item in datagrams:
                transport.sendto(item.data, self.target)
                self.stats.replayed += 1
                await asyncio.sleep(0)  # let the target read them one by one
        finally:
            transport.close()

    async def close(self) -> None:
        self._closed = True
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()
        for leg in self._clients.values():
            if leg.transport is not None:
                leg.transport.close()
        self._clients.clear()
        if self._listen is not None and self._listen.transport is not None:
            self._listen.transport.close()

    async def __aenter__(self) -> UdpRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------------------------

    def from_client(self, data: bytes, client: Address) -> None:
        if self._closed:
            return
        self.stats.received += 1
        if self._capturing and len(self.captured) < self._capture_limit:
            self.captured.append(Captured(client, data))
        leg = self._clients.get(client)
        if leg is None:
            if len(self._clients) >= self.max_clients:
                self.stats.dropped_queue += 1
                return
            leg = _Leg(self, client)
            self._clients[client] = leg
            leg.backlog.append(data)
            task = asyncio.get_running_loop().create_task(self._open_upstream(leg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if leg.transport is None or leg.backlog:  # keep a new client's first datagrams in order
            if len(leg.backlog) < self.max_queue:
                leg.backlog.append(data)
            else:
                self.stats.dropped_queue += 1
            return
        self._impair(self._up, data, leg, self.target)

    async def _open_upstream(self, leg: _Leg) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: leg, local_addr=(self.host, 0))
        backlog, leg.backlog = leg.backlog, []
        for data in backlog:
            self._impair(self._up, data, leg, self.target)

    def from_target(self, data: bytes, client: Address) -> None:
        if self._closed or self._listen is None:
            return
        self.stats.received += 1
        self._impair(self._down, data, self._listen, client)

    def _impair(self, direction: _Direction, data: bytes, via: _Leg, dest: Address) -> None:
        imp = direction.impairment
        rng = self._rng
        if imp.mtu is not None and len(data) + UDP_IPV4_OVERHEAD > imp.mtu:
            self.stats.dropped_mtu += 1
            return
        if imp.loss and rng.random() < imp.loss:
            self.stats.dropped_loss += 1
            return
        copies = 1
        if imp.duplicate and rng.random() < imp.duplicate:
            copies = 2
            self.stats.duplicated += 1
        for _ in range(copies):
            delay = imp.delay + (rng.uniform(0.0, imp.jitter) if imp.jitter else 0.0)
            if imp.reorder and rng.random() < imp.reorder:
                delay += imp.reorder_delay
                self.stats.reordered += 1
            if delay <= 0.0:
                self._send(via, data, dest)
                continue
            if direction.in_flight >= self.max_queue:
                self.stats.dropped_queue += 1
                continue
            direction.in_flight += 1
            loop = asyncio.get_running_loop()
            holder: list[asyncio.TimerHandle] = []
            handle = loop.call_later(delay, self._deliver, direction, via, data, dest, holder)
            holder.append(handle)
            self._pending.add(handle)

    def _deliver(
        self,
        direction: _Direction,
        via: _Leg,
        data: bytes,
        dest: Address,
        holder: list[asyncio.TimerHandle],
    ) -> None:
        direction.in_flight -= 1
        self._pending.discard(holder[0])
        self._send(via, data, dest)

    def _send(self, via: _Leg, data: bytes, dest: Address) -> None:
        if via.transport is None or via.transport.is_closing():
            self.stats.dropped_queue += 1
            return
        via.transport.sendto(data, dest)
        st = self.stats
        st.forwarded += 1
        if len(data) > st.largest_forwarded:
            st.largest_forwarded = len(data)
        if len(data) > 1200:
            st.forwarded_large += 1


__all__ = ["Captured", "Impairment", "RelayStats", "UdpRelay"]
