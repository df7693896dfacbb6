"""One IAC connection over one QUIC connection: :class:`QuicConn`.

The asyncio adapter around the sans-IO :class:`~iac.transport.core.ConnectionCore`,
which holds the connection's state (HANDSHAKING -> OPEN -> CLOSING -> CLOSED), its close
error, the backlog judge and the timer decisions. The adapter takes the raw QUIC events
its protocol (:mod:`.protocol`) hands it, moves frames in and out of streams
(:mod:`.streams`, :mod:`.inbound`), arms the one timer the core asks for (a PING every
``keepalive_interval``; ``idle_timeout`` closes a connection on which no frame moved,
IDLE_TIMEOUT), and carries out what the core decided. It owns its lifecycle:
:meth:`QuicConn.connect` (the dialer, :mod:`.dial`), :meth:`QuicConn.accept` (the
listener, :mod:`.listener`) and :meth:`QuicConn.abandon` run the HELLO exchange on the
control stream with the shared handshake builders of :mod:`iac.transport.session`; a
close is a flush bounded by ``linger_timeout``, GOAWAY, then the QUIC close carrying the
close code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from iac.errors import (
    CloseCode,
    ConnectionClosed,
    HandshakeError,
    IacError,
    ProtocolError,
    TransportError,
)
from iac.protocol.handshake import (
    ALPN,
    ClientHandshake,
    HelloOrder,
    ServerHandshake,
    channel_binding,
    error_from_close,
)
from iac.transport.base import BatchHandler, Connection, Incoming, PeerInfo, TransportConfig, format_host
from iac.transport.core import (
    IDLE_REASON,
    SILENT_REASON,
    ConnectionCore,
    Judged,
    State,
    TimerEvent,
    closed_by_this_side,
    keepalive_slack,
)
from iac.transport.queues import SendQueue
from iac.transport.quic.ackfreq import AckFrequency
from iac.transport.quic.gso import GsoSender
from iac.transport.quic.inbound import QuicInbound
from iac.transport.quic.pathmtu import PmtuDriver
from iac.transport.quic.protocol import QuicProtocol
from iac.transport.quic.reset import ResetTokens, matches, may_be_reset
from iac.transport.quic.streams import CONTROL_STREAM, QuicStats, write_streams
from iac.transport.reader import Reader
from iac.transport.session import (
    DictState,
    HandshakeChannel,
    SessionLogic,
    client_handshake,
    goaway_frame,
    local_protocol_error,
    parse_hello,
    peer_closed_error,
    perform_handshake,
    server_handshake,
)
from iac.transport.timers import loop_clock, loop_timers
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.dicts import Dictionary
from iac.wire.frames import Frame, FrameType, encode_frame
from iac.wire.identity import Identity

log = logging.getLogger("iac.transport.quic")

#: The close error of a connection its peer reset (RFC 9000 10.3): the peer lost its state.
RESET_MESSAGE = "the peer no longer knows this connection (QUIC stateless reset: it restarted)"


class _ControlChannel(HandshakeChannel):
    """The control stream as :func:`perform_handshake` sees it."""

    def __init__(self, send: Callable[[bytes], None], read: Callable[[], Awaitable[Frame]]) -> None:
        self._send = send
        self._read = read

    async def send_frame(self, frame: bytes) -> None:
        self._send(frame)

    async def read_frame(self) -> Frame:
        return await self._read()


def quic_url(addr: Any) -> str:
    """``quic://host:port`` for a UDP address."""
    return f"quic://{format_host(str(addr[0]))}:{addr[1]}"


class QuicConn(Connection):
    """One IAC connection over one QUIC connection. ``dialed``: this side dialed (``dial_quic``);
    else a listener accepted it and ``on_finished`` tells the listener when it is over.

    The connection owns its lifecycle: the dialer calls :meth:`connect` (and :meth:`abandon`
    when the dial fails or is cancelled), the listener calls :meth:`accept`; both run the
    HELLO exchange here and open the session once the peer's HELLO verified."""

    def __init__(
        self,
        proto: QuicProtocol,
        identity: Identity,
        config: TransportConfig,
        *,
        dialed: bool,
        address: str = "",
        on_finished: Callable[[QuicConn], None] | None = None,
    ) -> None:
        self._proto = proto
        self.backend = proto.backend
        self._quic: Any = proto.quic
        self._loop = asyncio.get_running_loop()
        self._time = loop_clock(self._loop)  # loop.time, one call a read (hot paths)
        self.identity = identity
        self.config = config
        self.dialed = dialed
        self.address = address
        self._on_finished = on_finished
        self.stats = QuicStats()
        self.dicts: DictState = DictState(config, self._send_control_soon)  # this connection's dictionaries
        # send side
        self._queue = SendQueue(config.send_queue_frames, config.send_queue_bytes)
        self._drain_waiters: list[asyncio.Future[None]] = []
        # receive side (:mod:`.inbound`): frames stay compressed until recv() takes them, counted
        # against this connection's and the node's budget; while it is blocked, new stream
        # credit is withheld
        self._rx = QuicInbound(
            config,
            self.backend,
            self._quic,
            self.dicts.decode,
            self.stats,
            on_room=self._room,
            on_fault=self._protocol_error,
        )
        self._inbox = self._rx.inbox
        self._recv_full = False  # the inbox is blocked: new stream credit is withheld
        self._receiving = False  # a datagram's events are being handed on (on_datagram)
        self._withheld = 0
        self._room_handle: asyncio.Handle | None = None
        self._ctl_waiter: asyncio.Future[None] | None = None
        # the HELLO exchange's view of the control stream
        self._control = _ControlChannel(self._send_control, self._read_control)
        # state
        # state, close error and timers: the sans-IO core; ``_terminated`` wakes ``wait_closed``
        self._core = ConnectionCore(
            now=self._loop.time(),
            idle_timeout=config.idle_timeout,
            linger=config.linger_timeout,
            keepalive=config.keepalive_interval,
            probe_interval=config.probe_interval,
            probe_timeout=config.probe_timeout,
            keepalive_defer=0.0 if dialed else 2 * keepalive_slack(config.keepalive_interval),
        )
        self._terminated = asyncio.Event()
        self._handshake_task: asyncio.Task[None] | None = None
        #: The core's wake-up, in the loop's one timer structure (:mod:`iac.transport.timers`).
        self._wake = loop_timers(self._loop).timer(self._on_timer)
        #: The certificate hash the HELLOs are bound to (the server's certificate).
        self.channel_binding = b""
        self.peer_hello_verified = False
        self._verified = asyncio.Event()
        self._tls_done = asyncio.Event()  # the TLS handshake completed (HandshakeCompleted)
        self.early_data = False
        self.early_data_accepted = None
        self.on_early_outcome = None
        self.shared_socket = False  #: dialed from a listener's socket, which outlives it
        self._probe_waiters: list[asyncio.Future[bool]] = []
        resets = self.backend.resets
        if resets is not None:  # reset tokens this node can give again after a restart
            resets.issue_tokens(self._quic, ResetTokens(identity.seed()))

    # -- Connection API -------------------------------------------------------------------------

    def try_send(self, frame: bytes, *, early: bool = True) -> bool:
        if not early and self.early_data and not self.peer_hello_verified:
            return False  # send() waits for the server's HELLO
        core = self._core
        if core.closed:
            raise core.error or ConnectionClosed("connection closed")
        if not self._queue.offer(frame):
            return False
        core.last_activity = self._time()
        self._proto.transmit_soon()
        return True

    async def send(self, frame: bytes, *, early: bool = True) -> None:
        if not early and self.early_data and not self.peer_hello_verified:
            await self._verified.wait()  # out of early data: after the server's HELLO verified
        core = self._core
        if core.closed:
            raise core.error or ConnectionClosed("connection closed")
        queue = self._queue
        if not queue.offer(frame):
            await queue.put(frame)  # waits for room; raises once the connection closes
        self._core.last_activity = self._time()
        self._proto.transmit_soon()

    async def recv(self) -> Incoming:
        return (await self.recv_many(1))[0]

    async def recv_many(self, limit: int) -> list[Incoming]:
        return await self._inbox.get_many(limit)

    async def serve(self, handle: BatchHandler, limit: int) -> None:
        await Reader(self._inbox, handle, limit, self.flush).run()

    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        core = self._core
        if core.closed:
            await self.wait_closed()
            return
        flush = core.flushes_on_close(self.peer_hello_verified)
        core.close(closed_by_this_side(code, reason))
        self._queue.finish()  # no more frames: a waiting send() raises
        if flush:
            # Flush: everything queued reaches the peer (bounded by linger_timeout).
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
            self._proto.transmit()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout_at(core.linger_until(self._loop.time())):
                    await fut
        self._abort(int(code), reason, goaway=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(core.linger_until(self._loop.time())):
                await self._terminated.wait()
        self._finish()

    async def wait_closed(self) -> None:
        await self._terminated.wait()

    @property
    def send_dictionary(self) -> Dictionary | None:
        return self.dicts.send_dictionary

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def close_error(self) -> IacError | None:
        return self._core.error

    @property
    def state(self) -> State:
        """Where the connection is in its life (:class:`~iac.transport.core.State`)."""
        return self._core.state

    def received(self) -> int:
        return len(self._inbox)

    @property
    def path_mtu(self) -> PmtuDriver | None:
        """Path MTU discovery on this connection (its ``mtu``, search state and counts); None
        when it is off (``TransportConfig.quic_pmtud``) or the QUIC library lacks the hooks."""
        return self._proto.pmtu

    @property
    def gso(self) -> GsoSender | None:
        """Segmentation offload on this connection's sends (its counts); None when it is off
        (``TransportConfig.quic_gso``, a kernel without ``UDP_SEGMENT``, another QUIC library)."""
        return self._proto.gso

    @property
    def ack_frequency(self) -> AckFrequency | None:
        """The ACK Frequency extension on this connection (``negotiated``, ``stats``); None when
        it is off (``TransportConfig.quic_ack_frequency``) or the QUIC library lacks the hooks."""
        return self._proto.ackfreq

    @property
    def quic(self) -> Any:
        """The library's QUIC connection (for the backend's queries: certificates, resumption)."""
        return self._quic

    # -- send machinery -------------------------------------------------------------------------

    def _write_streams(self) -> bool:
        """Move queued frames into new uni streams while the peer's stream credit lasts;
        True if any moved."""
        if not self._queue.nbytes:
            return False
        if not self.peer_hello_verified and not self.early_data:
            return False
        return write_streams(self._queue, self._quic, self.backend, self.stats) > 0

    def before_transmit(self) -> None:
        """Called by the protocol before each flush (after every received datagram): what
        the library holds for reassembly is counted, queued frames go into streams (and
        then a pending ACK goes with them), stream credit is adjusted."""
        if not self._core.closed:
            try:
                self._rx.count_reassembly()
            except ProtocolError as exc:
                self._protocol_error(exc)
        if self._write_streams():
            self.backend.ack_now(self._quic, self._time())
        self._stream_credit()
        self.stats.transmits += 1

    def _stream_credit(self) -> None:
        """Receive-side backpressure: while the inbox is blocked (``recv()`` is behind, or
        this connection's or the node's budget is spent), grant the peer no new
        unidirectional streams (the library would return one per finished stream).
        Not on a backend without ``credit_control`` (qh3)."""
        self._recv_full = self._inbox.blocked
        if self._recv_full or self._withheld:
            self._withheld = self.backend.withhold_credit(self._quic, self._recv_full, self._withheld)

    def after_transmit(self) -> None:
        self.backend.withhold_credit(self._quic, False, 0)  # notes the stream credit just advertised
        if self._drain_waiters and self._drained():
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def settled(self) -> bool:
        """Nothing waits for a flush: no frame queued, no ``close()`` waiting for what it sent to
        be acknowledged, and the connection is open (the protocol then skips the flush after a
        datagram of ACKs only that freed nothing)."""
        return not self._queue.nbytes and not self._drain_waiters and self._core.state is State.OPEN

    def _drained(self) -> bool:
        if self._queue.nbytes:
            return False
        return self.backend.uni_streams_finished(self._quic, self.dialed)

    def _send_control(self, frame: bytes) -> None:
        if self._core.ended:
            raise self._core.error or ConnectionClosed("connection closed")
        self._quic.send_stream_data(CONTROL_STREAM, frame)
        self._proto.transmit()

    def _send_control_soon(self, frame: bytes) -> None:
        """A control frame (DICT, DICT_ACK) after the handshake: leaves with the next transmit."""
        if self._core.closed:
            return
        self._quic.send_stream_data(CONTROL_STREAM, frame)
        self._proto.transmit_soon()

    # -- receive machinery ----------------------------------------------------------------------

    def on_quic_event(self, event: Any) -> None:
        events = self.backend.events
        try:
            if isinstance(event, events.StreamDataReceived):
                self._on_stream_data(event)
            elif isinstance(event, events.StreamReset):
                self._rx.streams.reset(event.stream_id)
            elif isinstance(event, events.ConnectionTerminated):
                self._on_terminated(event)
            elif isinstance(event, events.HandshakeCompleted):
                self._on_tls_done(event)
            elif isinstance(event, events.PingAcknowledged):
                self._heard()
        except ProtocolError as exc:
            self._protocol_error(exc)

    def _on_stream_data(self, event: Any) -> None:
        if self._core.closed:
            return
        now = self._time()
        self._core.last_heard = now  # the peer is alive: no probe needed
        sid = event.stream_id
        if not sid & 2 and sid != CONTROL_STREAM:
            raise ProtocolError(f"unexpected bidirectional stream {sid} (only the control stream is used)")
        if not event.data and event.end_stream and sid not in self._rx.streams:
            return
        if not self._rx.stream_data(sid, event.data, event.end_stream):
            return
        self._core.last_activity = now  # (the same instant: one clock read per event)
        if self._core.session is not None:
            self._judge()
        elif self._rx.ctl_frames and self._ctl_waiter is not None and not self._ctl_waiter.done():
            self._ctl_waiter.set_result(None)

    def _judge(self) -> None:
        """Judge what arrived, in order, while the inbox has room; withhold stream credit
        while it has not."""
        try:
            judged = self._core.judge(self._inbox)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if judged is Judged.GOAWAY:  # the peer closes the QUIC connection after its GOAWAY
            self._wake_all()
            return
        if judged is Judged.CLOSED:
            return
        if self._inbox.blocked != self._recv_full:
            self._proto.transmit_soon()  # withhold or grant stream credit
        reader = self._inbox.reader
        if reader is not None and not self._receiving:  # (inside a datagram: after its events)
            reader.deliver()

    def _room(self) -> None:
        """Budget came back or the queue has room: judge the backlog (next turn)."""
        idle = self._room_handle is None and not self._core.ended
        if idle and (self._inbox.backlog or self._recv_full):
            self._room_handle = self._loop.call_soon(self._room_now)

    def _room_now(self) -> None:
        self._room_handle = None
        self._judge()

    # -- TLS and termination --------------------------------------------------------------------

    def _on_tls_done(self, event: Any) -> None:
        self._tls_done.set()
        if event.alpn_protocol != ALPN:
            raise HandshakeError(f"peer negotiated ALPN {event.alpn_protocol!r}, not {ALPN!r}")
        self._core.start_keepalive(self._loop.time())
        self._arm_timer()

    def _on_terminated(self, event: Any) -> None:
        self._end(None if self._core.error is not None else self._termination_error(event))
        self._finish()

    def _termination_error(self, event: Any) -> IacError:
        """Why the library says the QUIC connection ended (nothing of ours closed it first)."""
        if event.frame_type is None:
            # An application close from the peer: code and reason are IAC's.
            if self._core.session is None:
                return error_from_close(event.error_code, event.reason_phrase, during_handshake=True)
            return peer_closed_error(event.error_code, event.reason_phrase)
        if event.reason_phrase == "Idle timeout":
            return ConnectionClosed("no answer from the peer (QUIC idle timeout)")
        return ConnectionClosed(f"QUIC transport error 0x{event.error_code:x}: {event.reason_phrase}")

    def _end(self, error: IacError | None) -> None:
        """The QUIC connection is gone: the core is CLOSED, ``wait_closed`` returns."""
        self._core.terminated(error)
        self._terminated.set()

    def on_socket_error(self, exc: OSError) -> None:
        if self._core.error is None and not self.peer_hello_verified:
            self._core.close(TransportError(f"QUIC connect to {self.address} failed: {exc.strerror or exc}"))
            self._abort(int(CloseCode.NO_ERROR), "socket error", goaway=False)
            self._end(None)
            self._finish()

    def _protocol_error(self, exc: ProtocolError, *, goaway: bool = True) -> None:
        exc = exc.with_traceback(None)  # kept as the close error's cause: it must hold no frames
        self._core.close(local_protocol_error(exc))
        self._abort(int(exc.close_code), str(exc)[:200], goaway=goaway)

    def _refused(self, exc: ProtocolError) -> None:
        """The HELLO exchange failed with ``exc``: close with its code. A refusal of ours went
        out as GOAWAY already (:func:`perform_handshake`); a refusal of the peer's is answered."""
        self._protocol_error(exc, goaway=not self._control.goaway_sent)

    def _abort(self, code: int, reason: str, *, goaway: bool) -> None:
        """Close the QUIC connection now with ``code`` (an IAC close code); the core is
        closing already."""
        if self._core.ended:
            return
        if goaway and not self.backend.is_closing(self._quic):
            with contextlib.suppress(Exception):  # best effort: the close frame carries the code anyway
                self._quic.send_stream_data(CONTROL_STREAM, goaway_frame(code, reason))
                self._proto.transmit()
        self._quic.close(error_code=code, reason_phrase=reason)
        self._proto.transmit()
        self._wake_all(drop=True)

    def _wake_all(self, *, drop: bool = False) -> None:
        """The connection is closing: waiting ``send``/``recv`` calls raise the close error
        (``recv`` once it handed out what arrived before, unless this side closed: ``drop``)."""
        error = self._core.error
        if error is not None:
            # closed by this side: what is queued goes; by the peer: it is still handed out
            self._inbox.close(error, drop=drop)
        self._queue.finish(error)
        if self._ctl_waiter is not None and not self._ctl_waiter.done():
            self._ctl_waiter.set_result(None)
        for fut in self._drain_waiters:
            if not fut.done():
                fut.set_result(None)
        self._drain_waiters.clear()
        self._answer_probes(False)

    def _finish(self) -> None:
        """Release everything once the connection is over."""
        core = self._core
        if core.error is None:  # pragma: no cover - whoever ends the connection closes the core first
            core.close(ConnectionClosed("connection closed"))
        error = core.error or ConnectionClosed("connection closed")
        self._queue.fail(error)  # drop what was not sent
        self._verified.set()  # a send held out of early data raises the error now
        self._rx.clear()
        if self._room_handle is not None:
            self._room_handle.cancel()
            self._room_handle = None
        self._wake.cancel()
        self._wake_all()
        if self._on_finished is not None:
            self._on_finished(self)
        if self.dialed and core.ended and not self.shared_socket:
            self._proto.close_socket()

    # -- stateless reset (:mod:`.reset`) --------------------------------------------------------

    def stateless_reset(self, data: bytes) -> bool:
        """Whether ``data`` is a stateless reset of this connection: shaped like one, not a
        packet of it (its connection ID is none of this side's), ending with the token of a
        connection ID of the peer's this side used. Then the connection has ended, at once and
        sending nothing, with the close error :data:`RESET_MESSAGE`."""
        resets = self.backend.resets
        if resets is None or not may_be_reset(data) or self._core.ended:
            return False
        quic = self._quic
        if resets.owns(quic, data) or not matches(data, resets.peer_tokens(quic)):
            return False
        log.info(
            "quic connection %s ended: %s", self.address or "?", RESET_MESSAGE,
            extra={"transport": "quic", "reason": "stateless_reset"},
        )  # fmt: skip
        self._core.close(ConnectionClosed(RESET_MESSAGE, reason="stateless_reset"))
        resets.drop(quic)
        self._proto.process_events()  # ConnectionTerminated: the connection finishes
        self._proto.transmit()  # nothing to send; the library's timer goes
        return True

    # -- liveness -------------------------------------------------------------------------------

    async def alive(self, bound: float) -> bool:
        """Probe the peer (a QUIC PING): True once it acknowledged, within ``bound`` seconds;
        False when it did not (the connection is then closed, :func:`~iac.transport.core.silent_error`)
        or the connection is closing."""
        core = self._core
        if core.closed:
            return False
        if core.state is not State.OPEN:
            return True  # the HELLO exchange runs: the handshake timeout bounds it
        if core.probe(self._loop.time(), bound):
            self._quic.send_ping(1)
            self._proto.transmit()
        self._arm_timer()  # the probe's deadline may come first
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._probe_waiters.append(fut)
        try:
            return await fut
        finally:
            if fut in self._probe_waiters:
                self._probe_waiters.remove(fut)

    def watch(self, waiting: bool) -> None:
        if waiting == self._core.waiting:
            return
        self._core.waiting = waiting
        self._arm_timer()  # a probe may be due before the armed wake-up

    def _heard(self) -> None:
        self._core.heard(self._loop.time())
        self._answer_probes(True)

    def _answer_probes(self, alive: bool) -> None:
        for fut in self._probe_waiters:
            if not fut.done():
                fut.set_result(alive)
        self._probe_waiters.clear()

    # -- keep-alive and idle --------------------------------------------------------------------

    def on_datagram(self, now: float) -> None:
        """A packet arrived from the peer (the keep-alive PING waits ``keepalive`` after it;
        late in that wait, the wake-up moves with it instead of coming to find nothing due)."""
        core = self._core
        core.last_packet = now
        self._receiving = True
        if now >= core.rearm_after:
            self._arm_timer()

    def after_datagram(self) -> None:
        """The library's events of a datagram were handed on: the reader takes what they
        judged into the inbox (right here when it can: never inside the library's events)."""
        self._receiving = False
        reader = self._inbox.reader
        if reader is not None:
            reader.deliver()

    def _arm_timer(self) -> None:
        """Ask the loop's timer structure for the wake-up the core wants: the next PING, a
        probe's deadline or the idle deadline, each as late as it may be."""
        core = self._core
        if core.ended:
            core.rearm_after = float("inf")
            self._wake.at(None)
        else:
            self._wake.at(core.next_wake())

    def _on_timer(self) -> None:
        if self._core.closed:
            return
        event = self._core.handle_timer(self._loop.time())
        if event is TimerEvent.IDLE:
            self._abort(int(CloseCode.IDLE_TIMEOUT), IDLE_REASON, goaway=True)
            return
        if event is TimerEvent.DEAD:
            self._abort(int(CloseCode.IDLE_TIMEOUT), SILENT_REASON, goaway=True)
            return
        if event is TimerEvent.PING:
            self._quic.send_ping(0)
            self._proto.transmit()
        elif self._probe_waiters and not self._core.probing:  # the peer's data answered the probe
            self._answer_probes(True)
        self._arm_timer()

    # -- handshakes -----------------------------------------------------------------------------

    async def connect(
        self,
        sockaddr: Any,
        *,
        expect: str | None,
        session_id: int,
        resumed: tuple[bytes, str] | None,
        on_verified: Callable[[], None],
    ) -> None:
        """The dialing side: start the QUIC handshake toward ``sockaddr``, bind the HELLO to the
        server certificate's hash and run the HELLO exchange; done once the server's HELLO
        verified. ``resumed``: the certificate hash and AgentId stored with the session ticket
        the library resumes with; then, when 0-RTT is possible, the HELLO goes as early data,
        this returns at once and the server's HELLO is checked in the background.
        ``on_verified`` runs once the server's HELLO verified. Raises the typed error of a
        failed handshake (the caller then calls :meth:`abandon`)."""
        config = self.config
        deadline = self._loop.time() + config.handshake_timeout
        self._proto.connect(sockaddr)
        early = resumed is not None and self.backend.zero_rtt_ready(self._quic)
        if early and resumed is not None:
            self.channel_binding = resumed[0]
        else:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._wait_tls()
            except TimeoutError:
                raise TransportError(f"{self.address}: QUIC handshake timed out") from None
            der = self.backend.peer_certificate_der(self._quic)
            if der is None:
                if resumed is None:
                    raise HandshakeError("server sent no certificate")
                self.channel_binding = resumed[0]
            else:
                self.channel_binding = channel_binding(der)
        hs = client_handshake(
            self.identity,
            config,
            order=HelloOrder.CLIENT_FIRST,
            binding=self.channel_binding,
            expect=expect,
            session_id=session_id,
        )
        if early:
            # 0-RTT: the HELLO goes now; frames sent from here on ride as early data.
            self.early_data = True
            first = hs.initial(config.clock.now_us())
            if first is None:  # pragma: no cover - CLIENT_FIRST always has a first HELLO
                raise HandshakeError("no client HELLO")
            self._send_control(encode_frame(FrameType.HELLO, first, max_frame_size=1 << 30))
            self.local_hello = parse_hello(first)
            self.peer = PeerInfo(
                agent_id=expect or (resumed[1] if resumed else ""),
                transport="quic",
                address=self.address,
                hello=Hello(),
                resumed=True,
                dialed=True,
            )
            self._handshake_task = self._loop.create_task(self._finish_early(hs, deadline, on_verified))
            return
        try:
            hello = await self._exchange_hellos(hs, deadline)
        except TimeoutError:
            raise TransportError(f"{self.address}: HELLO exchange timed out") from None
        except ProtocolError as exc:
            self._refused(exc)
            raise
        self._hello_verified(hs, hello)
        error = self._core.error
        if error is not None:  # a frame that came with the HELLO closed the connection
            raise error
        on_verified()

    async def _finish_early(
        self, hs: ClientHandshake, deadline: float, on_verified: Callable[[], None]
    ) -> None:
        """The rest of a 0-RTT handshake: read and check the server's HELLO."""
        try:
            hello = await self._exchange_hellos(hs, deadline, initial_sent=True)
        except ProtocolError as exc:
            if not self._control.goaway_sent:
                self._core.close(exc)  # the server refused: send/recv raise its typed error, as dial would
            self._refused(exc)
            return
        except TimeoutError:
            self._fail(
                TransportError(f"{self.address}: HELLO exchange timed out"),
                CloseCode.HANDSHAKE_FAILED,
                "HELLO timeout",
                goaway=True,
            )
            return
        except IacError as exc:
            self._fail(exc, CloseCode.HANDSHAKE_FAILED, str(exc)[:200], goaway=False)
            return
        if self.peer.agent_id and hello.agent_id != self.peer.agent_id:
            self._protocol_error(HandshakeError("resumed server is not the one that issued the ticket"))
            return
        self._hello_verified(hs, hello)  # resumed: what the TLS handshake says (the server may refuse)
        self.early_data_accepted = accepted = self.backend.early_data_accepted(self._quic)
        if self.on_early_outcome is not None:
            self.on_early_outcome(accepted)
        on_verified()

    def abandon(self, reason: str = "dial failed") -> None:
        """The dial failed or was cancelled: close the QUIC connection at once (no GOAWAY) and
        release everything."""
        if not self._core.ended:
            self._core.close(ConnectionClosed(f"connection closed: {reason}"))
            self._abort(int(CloseCode.NO_ERROR), reason, goaway=False)
            self._end(None)
            self._finish()

    def accept(
        self,
        *,
        binding: bytes,
        precheck: Callable[[], None] | None,
        on_open: Callable[[QuicConn], None],
        on_refused: Callable[[QuicConn, str, str], None],
        arrived: float | None = None,
    ) -> None:
        """The accepting side: run the HELLO exchange (bound to this server's certificate hash
        ``binding``) in a task of its own. ``precheck`` runs when the client's HELLO arrives
        (CA mode); a verified peer goes to ``on_open``; a refusal closes the connection and
        goes to ``on_refused(conn, reason, detail)``. ``arrived``: the loop time the client's
        first datagram arrived (a dial that waited in the listener's queue starts later): the
        HELLO is due ``handshake_timeout`` after it (the client gives up by then), else after now."""
        self.channel_binding = binding
        due = (self._loop.time() if arrived is None else arrived) + self.config.handshake_timeout
        self._handshake_task = self._loop.create_task(self._accept(precheck, on_open, on_refused, due))

    async def _accept(
        self,
        precheck: Callable[[], None] | None,
        on_open: Callable[[QuicConn], None],
        on_refused: Callable[[QuicConn, str, str], None],
        due: float,
    ) -> None:
        config = self.config
        peer = self.backend.peer_address(self._quic)
        if peer is not None:
            self.address = quic_url(peer)
        hs = server_handshake(
            self.identity, config, order=HelloOrder.CLIENT_FIRST, binding=self.channel_binding
        )
        try:
            async with asyncio.timeout_at(due):
                hello = await perform_handshake(hs, self._control, clock=config.clock, precheck=precheck)
        except ProtocolError as exc:
            on_refused(self, exc.reason, str(exc))
            self._refused(exc)
            return
        except TimeoutError:
            on_refused(self, "handshake_timeout", "HELLO did not arrive in time")
            error = ConnectionClosed("HELLO did not arrive in time", int(CloseCode.HANDSHAKE_FAILED))
            self._fail(error, CloseCode.HANDSHAKE_FAILED, "HELLO timeout", goaway=True)
            return
        except IacError as exc:
            on_refused(self, exc.reason, str(exc))
            self._fail(exc, CloseCode.HANDSHAKE_FAILED, "handshake failed", goaway=False)
            return
        self._hello_verified(hs, hello)
        self.early_data_accepted = self.backend.early_data_accepted(self._quic)
        on_open(self)

    def _fail(self, error: IacError, code: int, reason: str, *, goaway: bool) -> None:
        """Close now with ``code``; ``error`` becomes the close error unless one is set."""
        self._core.close(error)
        self._abort(int(code), reason, goaway=goaway)

    async def _wait_tls(self) -> None:
        """Wait for the TLS handshake; raise the close error if the connection ends first.
        Only this connection's own events are awaited (not the library's shielded
        ``wait_connected`` future, which a cancelled dial would leave to fail unseen)."""
        if not self._tls_done.is_set() and not self._core.ended:
            done = asyncio.ensure_future(self._tls_done.wait())
            ended = asyncio.ensure_future(self._terminated.wait())
            try:
                await asyncio.wait((done, ended), return_when=asyncio.FIRST_COMPLETED)
            finally:
                done.cancel()
                ended.cancel()
        error = self._core.error
        if error is not None:
            raise error
        if not self._tls_done.is_set():
            raise TransportError(f"{self.address}: QUIC handshake failed")

    async def _read_control(self) -> Frame:
        while (frame := self._rx.read_control()) is None:
            error = self._core.error
            if error is not None:
                raise error
            if self._core.ended:
                raise ConnectionClosed("connection closed during the handshake")
            self._ctl_waiter = self._loop.create_future()
            await self._ctl_waiter
            self._ctl_waiter = None
        return frame  # decoded one at a time, as the HELLO exchange reads it

    async def _exchange_hellos(
        self, hs: ClientHandshake | ServerHandshake, deadline: float, *, initial_sent: bool = False
    ) -> Hello:
        """The HELLO exchange on the control stream, for both roles (``initial_sent``: the
        client's HELLO already went as 0-RTT data); returns the peer's verified HELLO.
        Raises what :func:`perform_handshake` raises, or TimeoutError at ``deadline``."""
        async with asyncio.timeout_at(deadline):
            return await perform_handshake(
                hs,
                self._control,
                clock=self.config.clock,
                initial_sent=initial_sent,
            )

    def _hello_verified(
        self, hs: ClientHandshake | ServerHandshake, hello: Hello, *, resumed: bool | None = None
    ) -> None:
        """The peer's HELLO verified (either role, 1-RTT or 0-RTT): record both HELLOs and
        the peer, process what arrived early, open the send path. ``resumed``: None reads
        it from the TLS session."""
        self.local_hello = parse_hello(hs.sent_bytes)
        self.peer = PeerInfo(
            agent_id=hello.agent_id,
            transport="quic",
            address=self.address,
            hello=hello,
            resumed=bool(self._quic.tls.session_resumed) if resumed is None else resumed,
            dialed=self.dialed,
        )
        session = SessionLogic(hello.agent_id, self.dicts)
        self._core.open(session)
        self.peer_hello_verified = True
        self._verified.set()
        push = self.dicts.push_frame(self.identity.agent_id, hello)
        if push is not None:
            self._send_control_soon(push)  # on the control stream, behind our HELLO
        self._rx.start(session)  # what came behind the HELLO and what overtook it
        self._judge()
        if self._queue.nbytes:
            self._proto.transmit_soon()


__all__ = ["QuicConn"]
