"""Values the node hands to users (Reply, Sent, Context) and its internal records."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from iac.errors import RemoteError
from iac.protocol.files import AckPayload, FileSender
from iac.protocol.reorder import ReorderBuffer
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message, TaskState
from iac.wire.message import sender_of

if TYPE_CHECKING:
    from iac.node.node import Node

Key: TypeAlias = tuple[str, int, int]  # (agent_id, session_id, msg_id)


# --- values handed to users -----------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The answer to a request: the REPLY message and its decoded payload."""

    message: Message
    payload: Any

    @property
    def sender(self) -> str:
        return sender_of(self.message)

    @property
    def extra_data(self) -> bytes:
        return self.message.extra_data


class Sent:
    """A message handed to the transport. With ``ack=True``, :meth:`wait` returns once the
    receiver acknowledged it and raises :class:`DeliveryError` (no ACK before the delivery
    deadline) or :class:`~iac.RemoteError` (the receiver refused it)."""

    __slots__ = ("_future", "msg_id", "peer", "session_id")

    def __init__(self, peer: str, session_id: int, msg_id: int, future: asyncio.Future[Any] | None) -> None:
        self.peer = peer
        self.session_id = session_id
        self.msg_id = msg_id
        self._future = future

    async def wait(self) -> None:
        if self._future is not None:
            await asyncio.shield(self._future)

    @property
    def acked(self) -> bool:
        f = self._future
        return f is not None and f.done() and not f.cancelled() and f.exception() is None

    def __repr__(self) -> str:
        return f"Sent(peer={self.peer[:16]}…, session_id={self.session_id:#x}, msg_id={self.msg_id})"


@dataclass(frozen=True)
class Context:
    """What a handler gets: the verified message, its decoded payload and its deadline."""

    node: Node
    message: Message
    payload: Any
    expects_reply: bool

    @property
    def sender(self) -> str:
        return sender_of(self.message)

    @property
    def msg_type(self) -> int:
        return int(self.message.msg_type)

    @property
    def task(self) -> TaskState | None:
        return self.message.task if self.message.HasField("task") else None

    @property
    def deadline_us(self) -> int:
        """µs since the epoch by which the caller stops waiting (0: none)."""
        return int(self.message.deadline)

    def time_left(self) -> float | None:
        """Seconds until the deadline by the node's clock (None: no deadline; may be negative)."""
        if not self.message.deadline:
            return None
        return (self.message.deadline - self.node.clock.now_us()) / 1e6

    @property
    def extra_data(self) -> bytes:
        return self.message.extra_data

    @property
    def broadcast(self) -> bool:
        """True for a broadcast (empty ``to``): it is never answered."""
        return not self.message.to


@dataclass(frozen=True)
class FileSent:
    """The outcome of :meth:`~iac.Node.send_file`: the receiver verified the file and renamed it
    into its inbox as ``name``."""

    peer: str
    transfer_id: str
    #: The file's name in the receiver's inbox.
    name: str
    size: int
    #: Lowercase hex SHA-256 of the whole file (checked by the receiver before the rename).
    sha256: str
    #: Chunks in the file, chunk messages sent (first sends and resends), resends, and how many
    #: times the transfer resumed after a broken connection.
    chunks: int
    chunks_sent: int
    chunks_resent: int
    resumed: int
    seconds: float


@dataclass(frozen=True)
class ReceivedFile:
    """A file that arrived, was verified and was renamed into the inbox (``node.on_file``)."""

    sender: str
    transfer_id: str
    name: str
    path: Path
    size: int
    sha256: str


# --- internal records -----------------------------------------------------------------------------


class _Out:
    """One outgoing request or ACK_REQUESTED message waiting for its answer."""

    __slots__ = (
        "acked",
        "future",
        "give_up_at",
        "is_request",
        "key",
        "msg",
        "peer",
        "reliable",
        "rto",
        "timer",
        "via",
    )

    def __init__(self, peer: str, msg: Message, *, reliable: bool, is_request: bool, give_up_at: float,
                 rto: float, future: asyncio.Future[Any], via: str | None = None) -> None:  # fmt: skip
        self.peer = peer
        self.msg = msg
        self.key: Key = (peer, msg.session_id, msg.msg_id)
        self.reliable = reliable
        self.is_request = is_request
        self.give_up_at = give_up_at
        self.rto = rto
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.acked = False
        self.via = via


@dataclass(slots=True)
class _Item:
    """A message that passed every check up to the reorder step."""

    conn: Connection
    msg: Message
    payload: Any
    key: Key
    sealed: bool
    #: arrived inside FORWARD with an empty ``to``: delivered, never answered
    broadcast: bool = False


class _Ordered:
    """Reorder state of one sender session: the buffer, and the queue its worker drains in order."""

    __slots__ = ("buffer", "last_us", "queue", "timer", "timer_at", "worker")

    def __init__(self, buffer: ReorderBuffer[_Item], now_us: int) -> None:
        self.buffer = buffer
        self.queue: deque[_Item] = deque()
        self.worker: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: int | None = None
        self.last_us = now_us


class _FileOut:
    """One outgoing file transfer: its sans-IO sender and what arrived for it (acks, ERRORs)."""

    __slots__ = ("events", "peer", "sender", "waiter")

    def __init__(self, peer: str, sender: FileSender, max_events: int) -> None:
        self.peer = peer
        self.sender = sender
        # Every ack states the receiver's whole state, so dropping the oldest loses nothing.
        self.events: deque[AckPayload | RemoteError] = deque(maxlen=max_events)
        self.waiter: asyncio.Future[None] | None = None

    def push(self, event: AckPayload | RemoteError) -> None:
        self.events.append(event)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Counters:
    def __init__(self) -> None:
        self.sent = self.received = self.bytes_sent = self.bytes_received = 0
        self.handled = self.replies_sent = self.acks_sent = self.acks_received = 0
        self.retransmits = self.delivery_failures = self.throttled = 0
        self.gaps = self.late = self.cancelled = self.peer_events_dropped = 0
        self.backlog_peak = self.running_peak = 0
        self.relayed = 0
        self.files_sent = self.files_received = self.files_failed = self.files_resumed = 0
        self.refused: Counter[str] = Counter()
        self.errors_sent: Counter[str] = Counter()
        self.errors_received: Counter[str] = Counter()


#: ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` without building an encoder per call.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _error_payload(code: str, message: str) -> str:
    return _dumps({"code": code, "message": message[:500]})


def _error_fields(payload: Any) -> tuple[str, str]:
    if isinstance(payload, dict):
        code = payload.get("code")
        text = payload.get("message", "")
        if isinstance(code, str) and code:
            return code[:64], text if isinstance(text, str) else ""
    return "internal", "malformed ERROR payload"


__all__ = ["Context", "FileSent", "ReceivedFile", "Reply", "Sent"]
