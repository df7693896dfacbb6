"""The A2A gateway's HTTP connections, bounded per client address and in total: admitted when
accepted (:class:`GuardedListener`, a refused one closed at once), then timed while their request
head and body arrive (:func:`guarded_protocol`, uvicorn's HTTP/1.1 protocol with the bounds in
front). The bounds are :class:`~iac.integrations.a2a.tenants.GatewayLimits`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import weakref
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from iac.integrations.a2a.tenants import GatewayLimits
from iac.integrations.slots import AddressSlots, RefusalLog

log = logging.getLogger("iac.integrations")


def descriptor_room(reserve: int = 64) -> int:
    """Connections that fit under the descriptor limit: the soft ``RLIMIT_NOFILE`` less the
    descriptors open now and ``reserve`` for everything else (files, the node's own sockets)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 32
    return max(1, soft - open_now - reserve)


class _Count:
    """One live connection's share of the total, given back once (at close, or when its protocol
    is collected after a TLS handshake that failed before the connection was made)."""

    __slots__ = ("guard", "open")

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard, self.open = guard, True
        guard.live += 1

    def close(self) -> None:
        if self.open:
            self.open = False
            self.guard.live -= 1


class ConnectionGuard:
    """The gateway's HTTP connections: admitted per client address and in total when they are
    accepted (a refused one is closed at once, before any work is done for it), timed while
    their head or body arrives; counts what it refused and closed.

    The total is ``max_connections`` lowered to fit the descriptor limit; a spare descriptor is
    kept so that even at the limit a connection can be accepted and closed (not left in the
    kernel's queue, making the listening socket ready again and again)."""

    #: Connections refused in one go before the loop gets to do other work.
    BURST = 256

    def __init__(self, limits: GatewayLimits, what: str, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.total = min(limits.max_connections, descriptor_room())
        self.slots = AddressSlots(1 << 30, limits.max_per_address)  # per address, once made
        self.refusals = RefusalLog(log, what)
        self.clock = clock
        self.live = 0  # protocols made, not closed
        self.pending: deque[str] = deque()  # accepted, protocol not made yet (in order)
        self.pending_at: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        #: Connections closed for a slow head or body, by which.
        self.closed: Counter[str] = Counter()
        self._spare: int | None = None
        self._flush: asyncio.TimerHandle | None = None
        self.reserve()

    def reserve(self) -> None:
        if self._spare is None:
            with contextlib.suppress(OSError):
                self._spare = os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    @property
    def has_spare(self) -> bool:
        """Whether a descriptor is held in reserve (to accept and close one over the limit)."""
        return self._spare is not None

    def release_spare(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def admit(self, address: str) -> str | None:
        """At accept: None (admitted, now pending) or the bound it is over."""
        if self.live + len(self.pending) >= self.total:
            return "total"
        if self.slots.held[address] + self.pending_at[address] >= self.limits.max_per_address:
            return "per_address"
        self.pending.append(address)
        self.pending_at[address] += 1
        return None

    def made(self) -> _Count:
        """A protocol was made for the oldest pending connection."""
        if self.pending:
            address = self.pending.popleft()
            self.pending_at[address] -= 1
            if not self.pending_at[address]:
                del self.pending_at[address]
        return _Count(self)

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        due = self.refusals.refused(reason, self.clock())
        if due is not None and self._flush is None:  # the count since the last line, when due
            loop = asyncio.get_running_loop()

            def flush() -> None:
                self._flush = None
                self.refusals.flush(self.clock())

            self._flush = loop.call_later(max(due - self.clock(), 0.0), flush)

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self.release_spare()


class GuardedListener(socket.socket):
    """A listening socket whose ``accept`` (called by the event loop) closes at once what the
    guard refuses, so a refused connection costs an accept and a close."""

    guard: ConnectionGuard

    def accept(self) -> tuple[socket.socket, Any]:
        guard = self.guard
        for _ in range(guard.BURST):
            try:
                conn, addr = super().accept()
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not guard.has_spare:
                    raise
                guard.release_spare()  # room for one: take the connection off the queue and close it
                try:
                    conn, addr = super().accept()
                    conn.close()
                finally:
                    guard.reserve()
                guard.refuse("descriptors")
                continue
            reason = guard.admit(str(addr[0]) if isinstance(addr, tuple) else "")
            if reason is None:
                return conn, addr
            conn.close()
            guard.refuse(reason)
        raise BlockingIOError(errno.EAGAIN, "refused a burst; more on the next turn of the loop")


class _Guarded(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the gateway's connection bounds in front."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        count = self._count = self.guard.made()
        weakref.finalize(self, count.close)
        self._address: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the head (or body) being waited for began
        self._body = 0  # body bytes received of the request being read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else ""
        guard = self.guard
        refused = guard.slots.take(address)
        if refused is not None:  # more made at once than admitted (a TLS handshake overtook)
            guard.refuse(refused)
            self._count.close()
            transport.abort()
            return
        self._address = address
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._count.close()
        if self._address is None:
            return
        self.guard.slots.give(self._address)
        self._address = None
        self._cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting_head = self.conn.their_state is h11.IDLE
        if waiting_head and self._timer is None and data:
            self._await_head()  # the first byte of a kept-alive connection's next request
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if waiting_head:  # the head just arrived
                self._cancel()
                self._since, self._body = self.guard.clock(), 0
                self._arm(self.guard.limits.head_timeout, self._check_body)
            else:
                self._body += len(data)
        elif state is not h11.IDLE:
            self._cancel()

    def _await_head(self) -> None:
        self._since = self.guard.clock()
        self._arm(self.guard.limits.head_timeout, self._head_late)

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._cancel()
        self._timer = self.loop.call_later(max(delay, 0.0), callback)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.guard.closed["slow_head"] += 1
            log.debug("gateway: closed a connection from %s: no request head within %g s",
                      self._address, self.guard.limits.head_timeout)  # fmt: skip
            self.transport.close()

    def _check_body(self) -> None:
        self._timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        limits = self.guard.limits
        due = self._since + limits.head_timeout + self._body / limits.min_body_rate
        now = self.guard.clock()
        if now < due or self.flow.read_paused:  # on time, or paused by the gateway itself
            self._arm(max(due - now, 1.0), self._check_body)
            return
        self.guard.closed["slow_body"] += 1
        log.debug("gateway: closed a connection from %s: its body came slower than %d bytes/s",
                  self._address, limits.min_body_rate)  # fmt: skip
        self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    """The HTTP protocol class (uvicorn's ``Config(http=...)``) that applies ``guard``."""
    return type("GuardedH11", (_Guarded,), {"guard": guard})


__all__ = ["ConnectionGuard", "GuardedListener", "descriptor_room", "guarded_protocol"]
