"""The receive path of one QUIC connection, and the bounds on what a peer can make it hold.

:class:`QuicInbound` (no asyncio; the connection drives it with the library's events):

* one frame decoder per stream (:class:`StreamDecoders`); whole frames come out
  compressed and stay so until ``recv()`` takes them (:class:`~iac.transport.queues.Inbox`;
  the connection core judges them into it, :meth:`~iac.transport.core.ConnectionCore.judge`);
* before the HELLO verified: control-stream frames wait for the HELLO exchange, frames
  on unidirectional streams are held as they came (:class:`EarlyFrames`);
* counted against the connection's receive budget (and the node's): partly received
  frames, the stream data the QUIC library holds behind gaps (a packet at a high offset
  makes it allocate the whole gap), unjudged and queued frames. A QUIC peer can keep
  sending on the streams it has after the receiver withholds new stream credit, so
  bytes beyond ``recv_budget_bytes`` close the connection (BUFFER_EXCEEDED); before the
  HELLO verified, bytes beyond ``early_frames_bytes`` (plus one HELLO) do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from iac.errors import HandshakeError, ProtocolError
from iac.transport.base import TransportConfig
from iac.transport.budget import RecvBudget
from iac.transport.queues import Inbox
from iac.transport.quic.backend import Backend
from iac.transport.quic.streams import STREAM_WINDOW, QuicStats, StreamDecoders
from iac.transport.session import EarlyFrames, SessionLogic
from iac.wire.dicts import DictionarySet
from iac.wire.frames import Frame, FrameType, PackedFrame


class QuicInbound:
    """Frames in from the streams of one QUIC connection, judged into its :class:`Inbox`."""

    def __init__(
        self,
        config: TransportConfig,
        backend: Backend,
        quic: Any,
        dictionaries: DictionarySet,
        stats: QuicStats,
        *,
        on_room: Callable[[], None],
        on_fault: Callable[[ProtocolError], None],
    ) -> None:
        self.config = config
        self.backend = backend
        self.quic = quic
        self.dictionaries = dictionaries
        self.stats = stats
        self.streams = StreamDecoders(config.max_frame_size)
        self.inbox = Inbox(
            max_frames=config.recv_queue_frames,
            budget=RecvBudget(config.recv_budget_bytes, config.memory),
            dictionaries=dictionaries,
            batch_bytes=config.max_frame_size,
            on_room=on_room,
            on_fault=on_fault,
        )
        self.session: SessionLogic | None = None
        self.early = EarlyFrames(config.early_frames_limit, config.early_frames_bytes)
        self.ctl_frames: deque[PackedFrame] = deque()  # control frames before the HELLO verified
        self.ctl_bytes = 0
        self.reassembly = 0  # stream data the library holds behind gaps
        backend.limit_stream_window(quic, STREAM_WINDOW)

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> int:
        """Data on a stream; return how many frames it completed. Raises a
        :class:`ProtocolError` for what the peer may not send."""
        unidirectional = bool(stream_id & 2)
        streams = self.streams
        frames = streams.feed(stream_id, data, end_stream=end, final=end and unidirectional)
        self.inbox.set_partial(streams.buffered + self.reassembly)
        if not frames:
            self.check_held()
            return 0
        if not unidirectional:
            if self.session is not None:
                self.inbox.arrived(frames)
            else:
                self.ctl_frames.extend(frames)
                self.ctl_bytes += sum(frame.wire_size for frame in frames)
        else:
            self.stats.frames_received += len(frames)
            if self.session is None:
                self._hold_early(frames)
            else:
                self.inbox.arrived(frames)
        self.check_held()
        return len(frames)

    def _hold_early(self, frames: list[PackedFrame]) -> None:
        """Frames that overtook the HELLO: held compressed (and counted) until it verifies."""
        for frame in frames:
            if frame.type == FrameType.HELLO:
                raise HandshakeError("HELLO on a unidirectional stream", reason="unexpected_hello")
            self.early.hold(frame)
            self.inbox.budget.take(frame.wire_size)
        self.stats.early_frames += len(frames)

    def count_reassembly(self) -> None:
        """Count the stream data the QUIC library holds behind gaps; raises
        ``buffer_exceeded`` past the budget."""
        held = self.backend.reassembly_bytes(self.quic)
        if held != self.reassembly:
            self.reassembly = held
            self.inbox.set_partial(self.streams.buffered + held)
            self.check_held()

    def check_held(self) -> None:
        """Whatever the pushback, partly received (or, in the library, reassembled) and
        unjudged frames stay within ``recv_budget_bytes``; before the HELLO verified, all
        of it within ``early_frames_bytes`` plus one HELLO."""
        config = self.config
        wire = self.streams.buffered + self.reassembly + self.inbox.backlog_bytes
        if wire > config.recv_budget_bytes:
            raise ProtocolError(
                f"partly received and unjudged frames exceed recv_budget_bytes ({config.recv_budget_bytes})",
                reason="buffer_exceeded",
            )
        if self.session is None:
            early = self.streams.buffered + self.reassembly + self.early.nbytes + self.ctl_bytes
            if early > config.early_frames_bytes + config.max_frame_size:
                raise ProtocolError(
                    f"more than {config.early_frames_bytes} bytes of frames arrived "
                    "before the HELLO verified",
                    reason="buffer_exceeded",
                )

    def read_control(self) -> Frame | None:
        """The next control frame of the HELLO exchange, decoded (one at a time), or None."""
        if not self.ctl_frames:
            return None
        frame = self.ctl_frames.popleft()
        self.ctl_bytes -= frame.wire_size
        return frame.unpack(self.dictionaries)

    def start(self, session: SessionLogic) -> None:
        """The HELLO verified: what came behind it on the control stream, then what overtook
        it, join the frames to judge, in that order."""
        self.session = session
        inbox = self.inbox
        inbox.arrived(list(self.ctl_frames))
        self.ctl_frames.clear()
        self.ctl_bytes = 0
        inbox.budget.give(self.early.nbytes)  # counted again as they join the backlog
        inbox.arrived([f for f in self.early.release() if isinstance(f, PackedFrame)])

    def clear(self) -> None:
        """The connection is over: drop what is held."""
        self.streams.clear()
        self.early.release()
        self.ctl_frames.clear()
        self.ctl_bytes = 0


__all__ = ["QuicInbound"]
