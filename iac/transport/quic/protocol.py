"""The asyncio glue of the QUIC adapter: the library's protocol class, reduced to one job.

Each backend's ``QuicConnectionProtocol`` gets :class:`QuicProtocol` mixed in on top
(:func:`protocol_class`). It hands every raw QUIC event to the one connection it
carries (no per-stream readers), flushes received datagrams at the end of the loop
turn, and lets the connection move queued frames into streams right before each
flush. The connection is reached through :class:`ConnectionEvents` only, so this
module does not depend on :mod:`iac.transport.quic.connection`.

Pacing: the library builds a packet only when its pacer allows, and asks for a timer
when it does not (the flush that timer triggers goes through :meth:`QuicProtocol.transmit`
too). A connection whose congestion controller needs more than the library offers (BBR:
:mod:`iac.transport.quic.congestion`) gets its hooks when the protocol is made, and is
told before and after every flush (:class:`~iac.transport.quic.congestion.TransmitHooks`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from iac.transport.quic.ackfreq import AckFrequency
from iac.transport.quic.backend import AIOQUIC_PINNED, Backend
from iac.transport.quic.congestion import TransmitHooks, attach
from iac.transport.quic.gso import GsoSender, supported
from iac.transport.quic.pathmtu import PmtuDriver, driver_for
from iac.transport.timers import Timer, loop_clock, loop_timers


class ConnectionEvents(Protocol):
    """What :class:`QuicProtocol` calls on the connection it carries."""

    def on_quic_event(self, event: Any) -> None:
        """One QUIC event (stream data, stream reset, handshake done, terminated)."""

    def before_transmit(self) -> None:
        """Right before a flush: move queued frames into streams, adjust stream credit."""

    def after_transmit(self) -> None:
        """Right after a flush: wake ``close()`` once everything queued went out."""

    def on_socket_error(self, exc: OSError) -> None:
        """The UDP socket reported an error (an ICMP unreachable, say)."""

    def stateless_reset(self, data: bytes) -> bool:
        """Whether ``data`` is a stateless reset of this connection (then it has ended)."""

    def on_datagram(self, now: float) -> None:
        """A datagram from the peer arrived at ``now`` (before the library took it)."""

    def after_datagram(self) -> None:
        """The library's events of that datagram were handed on (the reader may take frames)."""

    def settled(self) -> bool:
        """Nothing of this connection waits for a flush (no frame queued, no ``close()`` waiting
        for what it sent to be acknowledged), and it is open."""


class LoopView:
    """The event loop as the library's protocol sees it: everything is the loop's own, except
    ``call_at``, which goes to the loop's one timer structure (:func:`~iac.transport.timers.loop_timers`,
    exact: the library's ACK-delay, loss and pacing deadlines are not rounded)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.time = loop_clock(loop)  # (the library reads the clock several times a datagram)
        self.call_soon = loop.call_soon
        self.create_future = loop.create_future
        self.call_at = loop_timers(loop).call_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


class QuicProtocol(asyncio.DatagramProtocol):
    """The library's asyncio protocol, reduced to raw events handed to one connection.
    Mixed into each backend's ``QuicConnectionProtocol`` by :func:`protocol_class`."""

    conn: ConnectionEvents | None = None
    backend: Backend
    _quic: Any
    _loop: asyncio.AbstractEventLoop
    _transmit_task: asyncio.Handle | None
    _transport: asyncio.DatagramTransport | None
    _cc_hooks: TransmitHooks | None = None
    #: The socket is the connection's own (a dial's): every datagram on it is looked at as a
    #: possible stateless reset first (on a listener's socket the listener does it).
    checks_resets = False
    #: Path MTU discovery (:mod:`iac.transport.quic.pathmtu`); None: packets stay at 1,200 bytes.
    pmtu: PmtuDriver | None = None
    #: Segmentation offload (:mod:`iac.transport.quic.gso`); None: one ``sendto`` per datagram.
    gso: GsoSender | None = None
    _gso_checked = False
    #: The ACK Frequency extension (:mod:`iac.transport.quic.ackfreq`); None: off.
    ackfreq: AckFrequency | None = None

    def __init__(self, quic: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(quic, *args, **kwargs)  # type: ignore[call-arg]  # the library's protocol
        self._cc_hooks = attach(quic, self.backend)
        # The library arms its one timer (ACK delay, loss detection, pacing, its idle close)
        # with ``self._loop.call_at``: through this view it is an exact entry of the loop's one
        # timer structure instead of a handle in the loop's heap (the probe timer too).
        self._loop = cast(asyncio.AbstractEventLoop, LoopView(self._loop))
        backend = self.backend
        if backend.name == "aioquic" and backend.version.startswith(AIOQUIC_PINNED + "."):
            # the library's timer as one Timer moved at each flush (see _library_transmit)
            self._quic_timer = loop_timers(self._loop.loop).timer(self._handle_timer)  # type: ignore[attr-defined]
            if self._cc_hooks is None and backend.ack_settle is not None:
                self._flushed, self._settled = backend.ack_settle(quic)
        if backend.mark_stream_frames is not None:
            backend.mark_stream_frames(quic, self)
        self.pmtu = driver_for(quic, self.backend, self._loop, self.transmit_soon)
        if backend.fast_padding is not None:  # a path MTU probe is one long PADDING run
            backend.fast_padding(quic)
        if self.backend.ack_frequency is not None:  # before the transport parameters are made
            self.ackfreq = self.backend.ack_frequency(quic)

    #: Events are being handed on (``_process_events`` runs).
    _in_events = False
    #: The library's one timer (ACK delay, loss, pacing, idle close) when this module flushes
    #: for it (:meth:`_library_transmit`); None: the library's own ``transmit`` flushes.
    _quic_timer: Timer | None = None
    _timer_at: float | None
    #: The backend's ``ack_settle`` pair (None: every datagram of ACKs only gets its flush).
    _flushed: Callable[[], None] | None = None
    _settled: Callable[[], bool] | None = None

    def _process_events(self) -> None:
        outer, self._in_events = self._in_events, True
        try:
            super()._process_events()  # type: ignore[misc]  # the library's QuicConnectionProtocol
        finally:
            self._in_events = outer

    if TYPE_CHECKING:  # provided by the library's QuicConnectionProtocol

        def connect(self, addr: Any) -> None: ...
        async def wait_connected(self) -> None: ...

    @property
    def quic(self) -> Any:
        """The library's QUIC connection this protocol carries."""
        return self._quic

    #: The datagram being taken gave the connection an event (stream data, a PING's ACK, ...)
    #: or a STREAM frame (whose data the library may hold back without an event): a reply may
    #: follow it, and its ACK follows the ACK policy (:meth:`_transmit_after_receive`).
    _evented = False

    #: The library's event class of an acknowledged PING (set per backend, :func:`protocol_class`).
    _ping_acked: type[Any] | None = None

    def quic_event_received(self, event: Any) -> None:
        if event.__class__ is not self._ping_acked:  # (nothing answers a PING's ACK on the wire)
            self._evented = True
        if self.conn is not None:
            self.conn.on_quic_event(event)

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        # As aioquic's, but the reader takes what the datagram's events judged in first, and
        # the flush waits for its reply (see _transmit_after_receive), so that the reply leaves
        # in the same packet as the ACK instead of a packet of its own right after an ACK-less one.
        now = self._loop.time()
        raw: bytes = data  # type: ignore[assignment]  # (asyncio's are bytes; cast() is a call)
        if self.checks_resets and self.conn is not None and self.conn.stateless_reset(raw):
            return
        if self.conn is not None:
            self.conn.on_datagram(now)
        self._evented = False
        self._quic.receive_datagram(raw, addr, now=now)
        self._process_events()
        if self.conn is not None:
            self.conn.after_datagram()
        self._transmit_after_receive(now)

    def datagrams_received(self, data: list[bytes], addr: Any) -> None:
        # qh3's batched receive path (its GRO transport; unused with asyncio's own), same rule.
        now = self._loop.time()
        if self.conn is not None:
            self.conn.on_datagram(now)
        self._evented = False
        self._quic.receive_many_datagrams(data, addr, now=now)
        self._process_events()
        if self.conn is not None:
            self.conn.after_datagram()
        self._transmit_after_receive(now)

    #: A send asked for a flush since the last one (``_transmit_soon``).
    _send_waiting = False

    def transmit_soon(self) -> None:
        """Flush at the end of this loop turn (frames queued in one turn leave together)."""
        self._send_waiting = True
        if self._transmit_task is None:
            self._transmit_task = self._loop.call_soon(self.transmit)

    _transmit_soon = transmit_soon  # the name the library's own writers call

    def process_events(self) -> None:
        """Hand the library's pending events on (after the connection ended outside a datagram)."""
        self._process_events()

    def close_socket(self) -> None:
        """Close the UDP socket of a dialed connection (one of its own)."""
        if self._transport is not None:
            self._transport.close()

    def _transmit_after_receive(self, now: float) -> None:
        """The flush after received datagrams: now if a send is waiting already (the reader
        answered right in this callback, :mod:`iac.transport.reader`: the reply and the ACK
        leave together), else at the end of this loop turn if a send is waiting by then (a
        reply of a reader woken in its task), else one turn later. A reply wakes the task that
        asked in the next turn: if that task sends its next request, the request and the
        pending ACK leave in one packet and one flush, instead of a flush that finds nothing to
        send (the ACK is not due yet) and another.

        A datagram that asks for an ACK but gave the connection no event and no STREAM frame (a
        keep-alive PING, a probe, flow-control frames) has no reply to wait for: its ACK is due now and the
        flush runs right here (or goes with the flush already due). A datagram of ACKs only
        keeps the turn's wait: the flush it may free data for gathers what the turn queues;
        unless it cannot free anything (nothing was lost or held back by the congestion window
        since the last flush, nothing is queued: the backend's ``ack_settle``): then there is no
        flush at all, only the library's timer follows (the loss timer of what it acknowledged
        goes). A keep-alive then costs the side that answers one flush, not a flush that finds
        nothing due, the library's ACK-delay timer and a second flush; a reply, once its ACK
        comes back, no second flush (docs/IMPLEMENTATION.md, "Timers at scale")."""
        if self._send_waiting:  # the reader answered right in this callback: with the ACK, now
            self.transmit()
        elif self._evented or not self.backend.ack_now(self._quic, now):
            if self._transmit_task is None:
                settled = self._settled
                conn = self.conn
                if (
                    settled is not None
                    and not self._evented
                    and settled()
                    and conn is not None
                    and conn.settled()
                ):
                    self._follow_timer()  # ACKs only, and they free nothing to send
                else:
                    self._transmit_task = self._loop.call_soon(self._transmit_if_sending)
        elif self._transmit_task is None:  # an ACK is due and nothing will answer: it goes now
            self.transmit()

    def _transmit_if_sending(self) -> None:
        if self._send_waiting:
            self.transmit()
        else:
            self._transmit_task = self._loop.call_soon(self.transmit)

    def transmit(self) -> None:
        handle = self._transmit_task
        if handle is not None:  # a direct flush makes the scheduled one redundant
            handle.cancel()
        self._send_waiting = False
        conn = self.conn
        if conn is not None:
            conn.before_transmit()
        hooks = self._cc_hooks
        if hooks is not None:
            hooks.before_transmit(self._loop.time())
        if self.pmtu is not None:
            self.pmtu.before_transmit(self._transport)
        gso = self.gso if self._gso_checked else self._start_gso()
        try:
            if gso is None:
                self._library_transmit()
            else:  # the library's flush gathers into the sender, which sends trains
                transport, self._transport = self._transport, cast(Any, gso)
                try:
                    self._library_transmit()
                finally:
                    self._transport = transport
                gso.flush()
        except OSError as exc:  # the network boundary: as if the socket reported it
            self.error_received(exc)
        if self.backend.resets is not None and not self._in_events:
            # a connection ID issued in this flush goes into the listener's table now, before
            # the peer can use it: a packet for it is never taken for one of a lost connection
            # (a flush while events are handed on leaves it to that loop, which is not re-entered)
            self._process_events()
        if hooks is not None:
            hooks.after_transmit(self._loop.time())
        if conn is not None:
            conn.after_transmit()

    def _library_transmit(self) -> None:
        """The library's ``transmit``: send the datagrams it builds now, then arm its timer.
        On aioquic :data:`~iac.transport.quic.backend.AIOQUIC_PINNED` written out here (the
        library's, with the same attributes), so that its timer is one :class:`Timer` moved to
        each new deadline instead of an entry cancelled and a new one made at every flush."""
        timer = self._quic_timer
        if timer is None:
            super().transmit()  # type: ignore[misc]  # the library's QuicConnectionProtocol
            return
        self._transmit_task = None
        quic = self._quic
        for data, addr in quic.datagrams_to_send(now=self._loop.time()):
            self._transport.sendto(data, addr)  # type: ignore[union-attr]  # (as the library's)
        flushed = self._flushed
        if flushed is not None:
            flushed()
        timer_at = quic.get_timer()
        if timer_at != self._timer_at:  # (the library's _handle_timer sets None before it flushes)
            timer.at(timer_at)
            self._timer_at = timer_at

    def _follow_timer(self) -> None:
        """Move the library's timer to its deadline now (after a datagram that needs no flush)."""
        timer = self._quic_timer
        if timer is not None:
            timer_at = self._quic.get_timer()
            if timer_at != self._timer_at:
                timer.at(timer_at)
                self._timer_at = timer_at

    def _start_gso(self) -> GsoSender | None:
        """The connection's GSO sender, made at its first flush with a socket (None: off)."""
        transport = self._transport
        if transport is None:
            return None
        self._gso_checked = True
        hook = self.backend.gso_socket
        sock = hook(self._quic, transport) if hook is not None and supported() else None
        if sock is not None:
            self.gso = GsoSender(sock, transport)
        return self.gso

    def error_received(self, exc: Exception) -> None:
        if self.pmtu is not None and isinstance(exc, OSError) and self.pmtu.on_send_error(exc):
            return  # a probe larger than the local interface: that size fails, nothing else
        if self.conn is not None and isinstance(exc, OSError):
            self.conn.on_socket_error(exc)


_protocol_classes: dict[str, type[QuicProtocol]] = {}


def protocol_class(backend: Backend) -> type[QuicProtocol]:
    """The backend's ``QuicConnectionProtocol`` with :class:`QuicProtocol` on top."""
    cls = _protocol_classes.get(backend.name)
    if cls is None:
        cls = type(
            f"_{backend.name}Protocol",
            (QuicProtocol, backend.QuicConnectionProtocol),
            {
                "backend": backend,
                "_ping_acked": getattr(backend.events, "PingAcknowledged", None),
                "__module__": __name__,
            },
        )
        _protocol_classes[backend.name] = cls
    return cls


__all__ = ["ConnectionEvents", "QuicProtocol", "protocol_class"]
