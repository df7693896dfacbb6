"""Frames in and out of QUIC streams, on the library's sans-IO connection object (no asyncio).

Sending (:func:`write_streams`): every frame goes on a new unidirectional stream
closed with FIN; small frames queued together share one, up to :data:`SHARE_LIMIT`
bytes. A stream is opened only while the peer's stream credit allows it; the rest
waits in the connection's :class:`~iac.transport.queues.SendQueue` (the library's
own queue of blocked streams is scanned on every packet build, so it is never used).

Receiving (:class:`StreamDecoders`): one frame decoder per open stream, and a count
of the bytes they hold (partly received frames), which the connection counts against
its receive budget. Whole frames come out compressed (:class:`PackedFrame`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iac.transport.queues import SendQueue
from iac.transport.quic.backend import Backend
from iac.wire.frames import FrameDecoder, PackedFrame

#: Frames smaller than this share a stream with the other frames queued in the same turn.
SHARE_LIMIT = 1024
#: The control stream (client-initiated, bidirectional): HELLO, GOAWAY, DICT, DICT_ACK.
CONTROL_STREAM = 0
#: The receive window a new peer-opened stream starts with (the QUIC library widens it as the
#: stream's data arrives): what one packet at a high offset can make the library hold.
STREAM_WINDOW = 256 * 1024


@dataclass
class QuicStats:
    """Counters of one QUIC connection (tests and benchmarks read them)."""

    frames_sent: int = 0
    frames_received: int = 0
    streams_opened: int = 0
    credit_stalls: int = 0  # pumps that stopped for lack of stream credit
    transmits: int = 0
    max_blocked_streams: int = 0  # the library's internal queue of blocked streams (must stay 0)
    early_frames: int = 0


def write_streams(queue: SendQueue, quic: Any, backend: Backend, stats: QuicStats) -> int:
    """Move queued frames into new unidirectional streams while the peer's stream credit
    lasts; return how many frames moved (taking them wakes a ``send()`` waiting for room)."""
    sent = 0
    credit = backend.remote_max_streams_uni(quic)
    while queue.nbytes:
        stream_id = backend.next_stream_id_uni(quic)
        if stream_id // 4 >= credit:
            stats.credit_stalls += 1
            break
        parts = queue.take_shared(SHARE_LIMIT)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        quic.send_stream_data(stream_id, data, end_stream=True)
        sent += len(parts)
        stats.streams_opened += 1
    stats.frames_sent += sent
    blocked = backend.blocked_streams_uni(quic)
    if blocked > stats.max_blocked_streams:
        stats.max_blocked_streams = blocked
    return sent


class StreamDecoders:
    """One :class:`FrameDecoder` per open stream; ``buffered`` is the bytes they hold.

    Frames come out as received (:class:`PackedFrame`): the connection decompresses
    them, with its dictionaries, only when ``recv()`` takes them.
    """

    def __init__(self, max_frame_size: int) -> None:
        self._max_frame_size = max_frame_size
        self._decoders: dict[int, FrameDecoder] = {}
        self.buffered = 0

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self._decoders

    def feed(self, stream_id: int, data: bytes, *, end_stream: bool, final: bool) -> list[PackedFrame]:
        """The frames completed by ``data``. ``end_stream`` forgets the stream's decoder;
        ``final`` also refuses a frame cut off by the end (unidirectional streams)."""
        dec = self._decoders.get(stream_id)
        if dec is None:  # (a new stream: its decoder holds nothing yet)
            dec = self._decoders[stream_id] = FrameDecoder(max_frame_size=self._max_frame_size)
            before = 0
        else:
            before = dec.buffered
        frames = dec.feed_packed(data, final=final)
        if end_stream:  # what the stream's decoder held goes with it
            self._decoders.pop(stream_id, None)
            self.buffered -= before
        else:
            self.buffered += dec.buffered - before
        return frames

    def reset(self, stream_id: int) -> None:
        """The peer abandoned the stream: drop what its decoder held."""
        dec = self._decoders.pop(stream_id, None)
        if dec is not None:
            self.buffered -= dec.buffered

    def clear(self) -> None:
        self._decoders.clear()
        self.buffered = 0


__all__ = ["CONTROL_STREAM", "SHARE_LIMIT", "STREAM_WINDOW", "QuicStats", "StreamDecoders", "write_streams"]
