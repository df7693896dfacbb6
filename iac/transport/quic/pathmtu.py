"""The asyncio side of path MTU discovery: one :class:`PmtuDriver` per QUIC connection.

It runs the sans-IO search (:class:`~iac.transport.quic.pmtud.PathMtu`) against the library's
connection through the backend's :class:`~iac.transport.quic.backend.PmtuHooks`: right before
each flush (:meth:`PmtuDriver.before_transmit`, called by the asyncio protocol) it notices a
new path, hands the library the packet size the search allows, and sends the probe that is
due (one at a time, outside the congestion window: a full window must not keep a black hole
from being confirmed); a timer expires probes nobody answered. Data
packets never carry a probe's size before that probe was acknowledged.

The UDP socket is switched to "probe" path MTU mode (``IP_PMTUDISC_PROBE``: the kernel sets
Don't Fragment and never fragments, so a probe too large for the path is lost instead of
arriving in fragments; one too large for the local interface fails with ``EMSGSIZE``, which
fails its size at once). A backend without the hooks (qh3) keeps every packet at 1,200 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable
from typing import Any

from iac.transport.quic.backend import Backend, PmtuHooks
from iac.transport.quic.pmtud import PathMtu, PmtuSettings

#: Linux's values where the socket module lacks the names (``linux/in.h``, ``linux/in6.h``).
_IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
_IP_PMTUDISC_PROBE = getattr(socket, "IP_PMTUDISC_PROBE", 3)
_IPV6_MTU_DISCOVER = getattr(socket, "IPV6_MTU_DISCOVER", 23)
_IPV6_PMTUDISC_PROBE = getattr(socket, "IPV6_PMTUDISC_PROBE", 3)


def probe_mode(sock: Any) -> bool:
    """Put a UDP socket in "probe" PMTU mode (DF set, no local fragmentation); False where the
    platform has no such option (the search still works: a fragmenting path then passes
    probes, and the packets are fragmented)."""
    if sock is None:
        return False
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_MTU_DISCOVER, _IPV6_PMTUDISC_PROBE)
            with contextlib.suppress(OSError):  # a dual-stack socket sends IPv4 too
                sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_PROBE)
        else:
            sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_PROBE)
    except (OSError, AttributeError):
        return False
    return True


#: The size changes a driver remembers (the latest).
MAX_CHANGES = 32


class PmtuDriver:
    """Path MTU discovery for one library connection ``quic`` (see the module docstring)."""

    def __init__(
        self,
        quic: Any,
        backend: Backend,
        hooks: PmtuHooks,
        settings: PmtuSettings,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[], None],
    ) -> None:
        self.quic = quic
        self.backend = backend
        self.hooks = hooks
        self.loop = loop
        self.path = PathMtu(settings.max_size, enabled=settings.enabled)
        self._wake = wake  # a flush soon (the protocol's transmit_soon)
        self._applied = 1200
        self._addr: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._started = False
        self._sending: int | None = None  # the probe being handed to the socket
        #: (time, size) each time the size packets may use changed, for tests and reports.
        self.changes: list[tuple[float, int]] = []
        hooks.watch_losses(quic, self._on_loss)
        hooks.watch_acks(quic, self._on_acked)

    @property
    def mtu(self) -> int:
        """The UDP payload the connection's packets use now."""
        return self._applied

    def before_transmit(self, transport: Any) -> None:
        """Right before a flush: follow the path, apply the size, send a due probe."""
        quic, hooks, path = self.quic, self.hooks, self.path
        if not self._started:
            if not hooks.handshake_confirmed(quic):
                return
            self._started = True
            if transport is not None:
                probe_mode(transport.get_extra_info("socket"))
            path.limit(hooks.largest)  # what the library builds correctly
            path.limit(hooks.peer_max_udp_payload(quic))
            self._addr = self.backend.peer_address(quic)
            path.start(self.loop.time())
        now = self.loop.time()
        addr = self.backend.peer_address(quic)
        if addr != self._addr:  # a new path (migration, a NAT-punched path): start it at the base
            self._addr = addr
            path.reset(now)
        if path.mtu != self._applied:  # (_apply's test, written out: it runs for every flush)
            self._apply(now)
        size = path.next_probe(now)
        if size is not None and transport is not None:  # one at a time, outside the congestion window
            self._probe(transport, size, now)
        at = path.probe_deadline
        if at != self._timer_at:  # (_arm's test, written out)
            self._arm(at)

    def on_send_error(self, exc: OSError) -> bool:
        """The socket refused a send: True when it was a probe too large to leave (consumed)."""
        ident = self._sending
        if ident is None or exc.errno != errno.EMSGSIZE:
            return False
        self.path.probe_refused(ident, self.loop.time())
        return True

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _probe(self, transport: Any, size: int, now: float) -> None:
        path = self.path
        ident = 0

        def done(acked: bool) -> None:
            at = self.loop.time()
            if acked:
                path.probe_acked(ident, at)
            else:
                path.probe_lost(ident, at)
            self._wake()  # apply the new size, or send the next probe

        datagrams = self.hooks.send_probe(self.quic, size, now, done)
        if not datagrams:
            return
        ident = path.probe_sent(size, now, self.hooks.probe_timeout(self.quic))
        self._sending = ident
        try:
            for data, addr in datagrams:
                transport.sendto(data, addr)
        except OSError as exc:  # asyncio reports most errors to error_received; some raise
            self.on_send_error(exc)
        finally:
            self._sending = None

    def _apply(self, now: float) -> None:
        mtu = self.path.mtu
        if mtu != self._applied:
            self.hooks.set_datagram_size(self.quic, mtu)
            self._applied = mtu
            self.changes.append((now, mtu))
            del self.changes[:-MAX_CHANGES]

    def _on_loss(self, largest: int, sent_at: float | None, now: float) -> None:
        if largest > 1200:
            self.path.on_large_loss(now, sent_at)

    def _on_acked(self, size: int, sent_at: float) -> None:
        if self.path.confirming:  # only then does an acknowledged data packet tell anything
            self.path.on_large_acked(size, sent_at, self.loop.time())

    def _arm(self, at: float | None) -> None:
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self.path.on_timer(self.loop.time())
        self._wake()


def driver_for(
    quic: Any, backend: Backend, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]
) -> PmtuDriver | None:
    """A driver for ``quic`` when its backend has the hooks and its configuration asks for
    probing (the settings :mod:`iac.transport.quic.configuration` put there)."""
    hooks = backend.pmtu
    if hooks is None:
        return None
    settings = hooks.settings(quic)
    if not isinstance(settings, PmtuSettings) or not settings.enabled:
        return None
    return PmtuDriver(quic, backend, hooks, settings, loop, wake)


__all__ = ["PmtuDriver", "driver_for", "probe_mode"]
