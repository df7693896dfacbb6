"""A verified connection over one byte stream, and :func:`establish`, which makes one.

:class:`StreamConnection` is the asyncio adapter around the sans-IO
:class:`~iac.transport.core.ConnectionCore`: it feeds received bytes to the frame decoder
and the core's backlog judge, hands what was judged to the connection's reader
(:mod:`iac.transport.reader`, right in the receive callback when it can), writes the first
frame ``send`` queued in a loop turn at once and those behind it at the turn's end, arms the
one timer the core asks for, and carries out a close the core decided (GOAWAY, flush, linger,
socket close). State, close error and idle decisions live in the core."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from iac.errors import CloseCode, ConnectionClosed, IacError, ProtocolError, TransportError
from iac.protocol.handshake import ClientHandshake, ServerHandshake
from iac.transport.base import (
    BatchHandler,
    Connection,
    Incoming,
    PeerInfo,
    TransportConfig,
    map_network_errors,
)
from iac.transport.budget import RecvBudget
from iac.transport.core import IDLE_REASON, ConnectionCore, Judged, State, TimerEvent, closed_by_this_side
from iac.transport.queues import Inbox, SendQueue
from iac.transport.reader import Reader
from iac.transport.session import (
    DictState,
    SessionLogic,
    goaway_frame,
    local_protocol_error,
    parse_hello,
    perform_handshake,
)
from iac.transport.stream.protocol import NETWORK_ERRORS, FrameProtocol, describe_error
from iac.transport.timers import loop_clock, loop_timers
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.dicts import Dictionary

log = logging.getLogger("iac.transport")

#: Frames judged and queued for ``recv()`` per event-loop turn. A read that brought more
#: leaves the rest for the next turns, so the application answers the first requests
#: (and their replies leave) while later ones wait, instead of the two peers taking
#: turns at whole batches.
FRAMES_PER_TURN = 16


@contextlib.contextmanager
def connect_errors(
    url: str, config: TransportConfig, *, what: str = "connection", refused: str = "connection refused"
) -> Iterator[None]:
    """Turn what opening a stream socket raises into :class:`TransportError` naming ``url``.

    ``what`` did not come within the handshake timeout; ``refused`` says why a connect was
    refused. An error one transport reads more from (a TLS failure, a missing socket file) is
    caught inside the block, before this.
    """
    try:
        with map_network_errors(f"{url}: cannot connect"):
            yield
    except TimeoutError:
        raise TransportError(f"{url}: no {what} within {config.handshake_timeout:g} s") from None
    except TransportError as exc:
        if isinstance(exc.__cause__, ConnectionRefusedError):
            raise TransportError(f"{url}: {refused}") from None
        raise


async def establish(
    proto: FrameProtocol,
    hs: ClientHandshake | ServerHandshake,
    *,
    config: TransportConfig,
    transport: str,
    address: str,
    deadline: float,
) -> StreamConnection:
    """Run the HELLO exchange on a fresh stream; return the connection, or close the
    stream and raise (the typed handshake error, :class:`ConnectionClosed`, or
    :class:`TransportError` on timeout)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(deadline):
            peer_hello = await perform_handshake(hs, proto, clock=config.clock)
    except TimeoutError:
        await proto.close_transport(0.1)
        raise TransportError(f"{address}: handshake timed out after {config.handshake_timeout:g} s") from None
    except ProtocolError:
        if proto.goaway_sent:  # we refused: let the peer read our GOAWAY before we hang up
            await proto.wait_eof(min(config.linger_timeout, max(0.0, deadline - loop.time())))
        await proto.close_transport(0.1)
        raise
    except BaseException:
        await proto.close_transport(0.1)
        raise
    peer = PeerInfo(
        agent_id=peer_hello.agent_id,
        transport=transport,
        address=address,
        hello=peer_hello,
        dialed=isinstance(hs, ClientHandshake),
    )
    return StreamConnection(proto, peer, parse_hello(hs.sent_bytes), config)


class StreamConnection(Connection):
    """A verified connection over one byte stream."""

    def __init__(
        self, proto: FrameProtocol, peer: PeerInfo, local_hello: Hello, config: TransportConfig
    ) -> None:
        self.peer = peer
        self.local_hello = local_hello
        self.config = config
        self._proto = proto
        if proto.transport is None:  # pragma: no cover - establish runs after connection_made
            raise TransportError("stream connection without a transport")
        self._transport: asyncio.Transport = proto.transport
        self._decoder = proto.decoder
        self.dicts: DictState = proto.dicts
        self.dicts.send_control = self._send_control
        self._logic = SessionLogic(peer.agent_id, self.dicts)
        self._sendq = SendQueue(config.send_queue_frames, config.send_queue_bytes)
        # received frames, compressed, counted against this connection's and the node's budget
        self._inbox = Inbox(
            max_frames=config.recv_queue_frames,
            budget=RecvBudget(config.recv_budget_bytes, config.memory),
            dictionaries=self.dicts.decode,
            batch_bytes=config.max_frame_size,
            on_room=self._room,
            on_fault=self._protocol_fault,
        )
        self._eof_pending = False  # the peer hung up behind the backlog
        #: Called once the connection is closed (the listener forgets it then).
        self.on_closed: Callable[[StreamConnection], None] | None = None
        self._closed = asyncio.Event()
        self._read_done = asyncio.Event()
        self._write_done = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._time = loop_clock(loop)  # loop.time, one call a read (every read and write)
        self._core = ConnectionCore(
            now=loop.time(), idle_timeout=config.idle_timeout or None, linger=config.linger_timeout
        )
        self._core.open(self._logic)  # made once the HELLO exchange verified
        #: The core's wake-up (the idle deadline), in the loop's one timer structure.
        self._wake = loop_timers(loop).timer(self._on_timer)
        self._flush_handle: asyncio.Handle | None = None
        self._held = False  # frames a batch in the receive callback sent: written when it stops
        self._judge_handle: asyncio.Handle | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._arm_timer()
        proto.attach(self)
        # Our dictionary push goes first, ahead of any message.
        push = self.dicts.push_frame(local_hello.agent_id, peer.hello)
        if push is not None:
            self._send_control(push)
        # What arrived behind the HELLO, and what happened to the stream since.
        self._inbox.arrived(list(proto.pending))
        proto.pending.clear()
        self._inbox.set_partial(self._decoder.buffered)
        self._judge_backlog()
        if proto.read_error is not None:
            self._protocol_fault(proto.read_error)
        if proto.eof:
            self.on_eof()
        if proto.lost:
            self.on_lost(proto.lost_exc)

    # --- public ---------------------------------------------------------------------------------

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

    @property
    def finished(self) -> bool:
        """True once the connection is over: the socket is closed and ``on_closed`` ran."""
        return self._core.ended

    def received(self) -> int:
        return len(self._inbox)

    def try_send(self, frame: bytes, *, early: bool = True) -> bool:
        core = self._core
        if core.closed:
            raise core.error or ConnectionClosed("connection closed")
        if not self._sendq.offer(frame):
            return False
        if self._flush_handle is None:
            self._write_soon()
        return True

    async def send(self, frame: bytes, *, early: bool = True) -> None:
        if self.try_send(frame):
            return
        await self._sendq.put(frame)
        if self._flush_handle is None:
            self._write_soon()

    async def recv(self) -> Incoming:
        return (await self.recv_many(1))[0]

    async def recv_many(self, limit: int) -> list[Incoming]:
        return await self._inbox.get_many(limit)

    async def serve(self, handle: BatchHandler, limit: int) -> None:
        await Reader(self._inbox, handle, limit, self.flush).run()

    def flush(self) -> None:
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush()
        elif self._held:
            self._flush()

    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        self._start_close(closed_by_this_side(code, reason), goaway=(int(code), reason), graceful=True)
        await self.wait_closed()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- reading (called by the protocol) -------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        if self._core.closed:
            return  # lingering: discard until the peer hangs up
        self._core.last_activity = self._time()
        inbox = self._inbox
        try:
            frames = self._decoder.feed_packed(data)
        except ProtocolError as exc:
            self._protocol_fault(exc)
            return
        partial = self._decoder.buffered
        if partial != inbox.partial:
            inbox.set_partial(partial)
        if frames:
            inbox.arrived(frames)
            if self._judge_handle is None:
                self._judge_backlog()
        elif inbox.blocked:  # a partial frame spent the budget
            self._proto.pause_reading()

    def _room(self) -> None:
        """Budget came back or the queue has room: judge the backlog, read again (next turn)."""
        idle = self._judge_handle is None and not self._core.closed
        if idle and (self._proto.reading_paused or self._inbox.backlog):
            self._judge_handle = self._loop.call_soon(self._judge_backlog)

    def _judge_backlog(self) -> None:
        """Judge backlog frames into the receive queue while the budget holds them, at most
        :data:`FRAMES_PER_TURN` per event-loop turn; read again once nothing is left and
        the budget has room. Then the reader takes what was judged (right here when it can)."""
        self._judge_handle = None
        inbox = self._inbox
        try:
            judged = self._core.judge(inbox, FRAMES_PER_TURN)
        except ProtocolError as exc:
            self._protocol_fault(exc)
            return
        if judged is Judged.MORE:  # let the application work on what it has; go on next turn
            self._proto.pause_reading()
            self._judge_handle = self._loop.call_soon(self._judge_backlog)
        elif judged is Judged.BLOCKED:  # no room: a recv() (or another connection) gives budget back
            self._proto.pause_reading()
        elif judged is Judged.GOAWAY:
            self._closing(goaway=None, graceful=False)
            return
        elif self._eof_pending:
            self._eof_pending = False
            self.on_eof()
        elif not self._core.closed:
            proto = self._proto
            if inbox.blocked:
                proto.pause_reading()
            elif proto.reading_paused:
                proto.resume_reading()
        reader = inbox.reader
        if reader is not None:
            reader.deliver()

    def on_eof(self) -> None:
        if not self._core.closed:
            if self._inbox.backlog:
                self._eof_pending = True  # deliver what was read first
                return
            if not self._decoder.idle:
                self._protocol_fault(decoder_truncated())
            else:
                self._start_close(
                    ConnectionClosed("peer closed the connection without GOAWAY"), goaway=None, graceful=False
                )
        self._read_done.set()

    def on_lost(self, exc: BaseException | None) -> None:
        if not self._core.closed:
            if exc is None:
                self._eof_pending = False
                self._inbox.drop_backlog()
                self.on_eof()
            else:
                self._start_close(
                    ConnectionClosed(f"connection lost: {describe_error(exc)}"), goaway=None, graceful=False
                )
        self._read_done.set()
        self._write_done.set()

    def _protocol_fault(self, exc: ProtocolError) -> None:
        exc = exc.with_traceback(None)  # kept as the close error's cause: it must hold no frames
        log.info(
            "closing connection to %s: %s: %s", self.peer.agent_id[:16], exc.reason, exc,
            extra={"peer": self.peer.agent_id[:16], "transport": self.peer.transport, "reason": exc.reason,
                   "code": exc.close_code.name},
        )  # fmt: skip
        self._start_close(local_protocol_error(exc), goaway=(exc.close_code, str(exc)), graceful=False)

    # --- writing --------------------------------------------------------------------------------

    def _write_soon(self) -> None:
        """A frame was queued and no flush is set: write it now, after the batch the reader runs
        in the receive callback, or at the end of this turn."""
        reader = self._inbox.reader
        if reader is None or not reader.busy:  # the first frame of this turn: at once
            self._flush()
        elif reader.running:  # a batch in the receive callback: written when it stops
            self._held = True
        else:  # the frames queued behind it in this turn: together, at its end
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write everything queued with one write (unless backpressured)."""
        self._flush_handle = None
        self._held = False
        proto = self._proto
        if proto.writing_paused or proto.lost:
            return  # resume_writing flushes
        data = self._sendq.take_data()
        if data:
            try:
                self._transport.write(data)
            except NETWORK_ERRORS as exc:  # the boundary: the connection is lost, with why
                self.on_lost(exc)
                return
            self._core.last_activity = self._time()
        if self._core.closed and self._sendq.done and not proto.writing_paused:
            self._write_done.set()

    def _send_control(self, frame: bytes) -> None:
        """Queue a control frame (DICT, DICT_ACK) past the send bound; flush this turn."""
        if self._core.closed:
            return
        self._sendq.put_nowait(frame)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def on_writable(self) -> None:
        if self._flush_handle is None and (len(self._sendq) or self._sendq.done):
            self._flush_handle = self._loop.call_soon(self._flush)

    # --- closing --------------------------------------------------------------------------------

    def _start_close(self, error: IacError, *, goaway: tuple[int, str] | None, graceful: bool) -> None:
        """A reason to close: the core decides whether it is the first; then close."""
        if self._core.close(error):
            self._closing(goaway=goaway, graceful=graceful)

    def _closing(self, *, goaway: tuple[int, str] | None, graceful: bool) -> None:
        """The core began closing: send our GOAWAY (``goaway``: code and reason; None after the
        peer's), after what is queued (``graceful``) or instead of it, then linger and close."""
        error = self._core.error
        if error is None:  # pragma: no cover - the core sets it before it reports a close
            return
        # closed by this side: what is queued goes; by the peer: it is still handed out
        self._inbox.close(error, drop=goaway is not None)
        self._decoder.discard()
        self._proto.resume_reading()  # lingering reads and discards until the peer hangs up
        self._wake.cancel()
        if goaway is not None and graceful:
            self._sendq.put_nowait(goaway_frame(*goaway))
            self._sendq.finish(error)
        else:
            self._sendq.fail(error)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        self._close_task = self._loop.create_task(self._finish_close(goaway, graceful))

    async def _finish_close(self, goaway: tuple[int, str] | None, graceful: bool) -> None:
        """Carry out the close: each wait (our GOAWAY written, the peer hanging up, the socket
        closing) lasts until the core's linger deadline from when it starts."""
        core = self._core
        loop = self._loop
        proto = self._proto
        try:
            if goaway is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(core.linger_until(loop.time())):
                        await self._write_done.wait()
                if not graceful and not proto.lost:
                    with contextlib.suppress(TimeoutError, *NETWORK_ERRORS, IacError):
                        self._transport.write(goaway_frame(*goaway))
                        async with asyncio.timeout_at(core.linger_until(loop.time())):
                            await proto.drain()
                # Let the peer read the GOAWAY and hang up before we close.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(core.linger_until(loop.time())):
                        await self._read_done.wait()
            await proto.close_transport(core.linger)
        finally:
            for handle in (self._flush_handle, self._judge_handle):
                if handle is not None:
                    handle.cancel()
            self._flush_handle = self._judge_handle = None
            self._core.terminated()
            self._closed.set()
            if self.on_closed is not None:
                self.on_closed(self)

    # --- the core's timer -----------------------------------------------------------------------

    def _arm_timer(self) -> None:
        self._wake.at(self._core.next_wake())

    def _on_timer(self) -> None:
        if self._core.handle_timer(self._loop.time()) is TimerEvent.IDLE:
            self._closing(goaway=(CloseCode.IDLE_TIMEOUT, IDLE_REASON), graceful=True)
        else:
            self._arm_timer()


def decoder_truncated() -> ProtocolError:
    return ProtocolError("the peer hung up inside a frame", reason="truncated_frame")


__all__ = ["FRAMES_PER_TURN", "StreamConnection", "decoder_truncated", "establish"]
