"""Values the node hands to users (Reply, Sent, FileSent, ReceivedFile), the sessions it sends in,
and the ERROR payload helpers its collaborators share."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from iac.errors import ConfigError
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import Session, sender_of

Key: TypeAlias = tuple[str, int, int]  # (agent_id, session_id, msg_id)


#: What the sender of a received message waits for (``Item.wants``): nothing (a one-way message
#: without ACK_REQUESTED, or a broadcast), the REPLY or ERROR of a request (its deadline is
#: set), or the ACK of an ACK_REQUESTED message.
WANTS_NOTHING, WANTS_REPLY, WANTS_ACK = 0, 1, 2


@dataclass(slots=True)
class Item:
    """A received message that passed every check: what reorder and the handlers get (and the
    receive pipeline's decision to deliver it, with its ``route``)."""

    conn: Connection
    msg: Message
    payload: Any
    key: Key
    sealed: bool
    #: arrived inside FORWARD with an empty ``to``: delivered, never answered
    broadcast: bool = False
    #: its replay-store reservation was committed or released
    committed: bool = False
    #: it holds a handler slot
    slot: bool = False
    #: stream parts sent so far (a STREAM request)
    parts: int = 0
    #: what its sender waits for (:data:`WANTS_REPLY`, :data:`WANTS_ACK`), decided once
    wants: int = WANTS_NOTHING
    #: The handler plan, made once when the dispatcher admits it: the function, and how it runs
    #: (``iac.node.dispatch``: inline, in a task, on a thread, as a stream); None before.
    handler: Callable[..., Any] | None = None
    mode: int = 0
    #: Where the receive pipeline sends it (a :class:`~iac.node.pipeline.Route`), decided once.
    route: int = 0
    #: The receive clock's reading (µs) for the batch it came in: its replay-store commit is
    #: stamped with it (the clock is read once per batch, not again per message handled).
    received: int = 0
    #: ``msg.msg_type``, ``msg.deadline`` and ``msg.flags``, read once by the pipeline (a protobuf
    #: field read costs about as much as a Python call; the dispatcher needs all three).
    msg_type: int = 0
    deadline: int = 0
    flags: int = 0


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

    def __repr__(self) -> str:
        extra = f", extra_data=<{len(self.message.extra_data)} bytes>" if self.message.extra_data else ""
        return f"Reply(sender={self.sender[:16]}…, payload={self.payload!r}{extra})"


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


class Broadcast(Sent):
    """What :meth:`~iac.Node.broadcast` returns: the ids it went out with and ``peers``, the
    number of connected peers it was sent to (0: it reached nobody; counted in
    ``stats().routing["unsent"]`` and logged as a WARNING). ``int(b)`` is ``b.peers``."""

    __slots__ = ("peers",)

    def __init__(self, session_id: int, msg_id: int, peers: int) -> None:
        super().__init__("", session_id, msg_id, None)
        self.peers = peers

    def __int__(self) -> int:
        return self.peers

    def __repr__(self) -> str:
        return f"Broadcast(session_id={self.session_id:#x}, msg_id={self.msg_id}, peers={self.peers})"


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
    #: Chunks the receiver already held when this transfer started (an earlier, interrupted one,
    #: possibly by another process): never sent again.
    chunks_resumed: int = 0


@dataclass(frozen=True)
class ReceivedFile:
    """A file that arrived, was verified and was renamed into the inbox (``node.on_file``)."""

    sender: str
    transfer_id: str
    name: str
    path: Path
    size: int
    sha256: str


C = TypeVar("C")


def subscribe(callbacks: list[C], callback: C) -> Callable[[], None]:
    """Append ``callback``; the function returned removes it again (once; later calls do nothing)."""
    callbacks.append(callback)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            callbacks.remove(callback)

    return remove


@dataclass(frozen=True, slots=True)
class SendOptions:
    """How messages go, as one value that every sending method of :class:`~iac.Node` takes as
    ``options=`` (``send``, ``request``, ``stream``, ``call``, ``invoke``, ``delegate``): build it
    once, use it for every call. A keyword argument given beside it with a value other than its
    default wins over the field. A field a method has no use for is ignored (``send`` waits for
    no answer, so it has no ``timeout``; only ``send`` orders, ``stream`` does not retransmit)."""

    #: ACK_REQUESTED: retransmitted until acknowledged (or answered).
    ack: bool = False
    #: ORDERED: delivered in order per session (``send``).
    ordered: bool = False
    #: The payload encrypted end to end to the receiver's key.
    sealed: bool = False
    #: Bytes beside the JSON payload, signed with the message.
    extra_data: bytes = b""
    #: Through this relay (inside FORWARD), else directly, a route, or the peer book.
    via: str | None = None
    #: False: never in 0-RTT early data.
    early: bool = True
    #: For a gateway: the caller it authenticated (field 19, signed with the message).
    principal: str = ""
    #: Seconds to wait for the answer; None: ``NodeConfig.request_timeout``.
    timeout: float | None = None

    def merged(self, **given: Any) -> SendOptions:
        """These options with each of ``given`` that differs from the field's default."""
        changed = {k: v for k, v in given.items() if v != _DEFAULT_FIELDS[k]}
        return dataclasses.replace(self, **changed) if changed else self


_DEFAULT_OPTIONS = SendOptions()
#: Each field's default, by name (read for every send: a dict, not ``getattr``).
_DEFAULT_FIELDS = {f.name: getattr(_DEFAULT_OPTIONS, f.name) for f in dataclasses.fields(SendOptions)}


def send_options(options: SendOptions | None, **given: Any) -> SendOptions:
    """``options`` (or the defaults) with the keyword arguments a caller gave beside it."""
    return (options or _DEFAULT_OPTIONS).merged(**given)


dumps = dumps_compact


def payload_text(payload: Any, payload_json: str | None) -> str:
    """The ``payload_json`` of a message to send: given, or ``payload`` as JSON ("" for None).
    A payload that is not JSON is the caller's to fix: :class:`~iac.ConfigError` says how."""
    if payload_json is not None:
        return payload_json
    if payload is None:
        return ""
    try:
        return dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the payload is not JSON ({exc}): pass dicts, lists, strings, numbers, booleans and None "
            "(convert the rest, e.g. a set to a list), or JSON text as payload_json=...; bytes go in "
            "extra_data=... or, for files, send_file()"
        ) from None


def error_payload(code: str, message: str) -> str:
    return dumps({"code": code, "message": message[:500]})


def error_fields(payload: Any) -> tuple[str, str]:
    if isinstance(payload, dict):
        code = payload.get("code")
        text = payload.get("message", "")
        if isinstance(code, str) and code:
            return code[:64], text if isinstance(text, str) else ""
    return "internal", "malformed ERROR payload"


class Sessions(dict[tuple[str, str], Session]):
    """This node's sending sessions, by ``(peer, kind)``; they survive reconnects.

    Toward each peer the node keeps up to three kinds, so that ordered streams have contiguous
    msg_ids: ``main`` (requests, one-way messages, answers), ``ordered_ack`` (ORDERED +
    ACK_REQUESTED) and ``ordered`` (ORDERED without acknowledgement); ``broadcast`` (peer ``""``)
    and ``file`` (file-transfer messages) have their own."""

    def __init__(self) -> None:
        super().__init__()
        #: When each session last sent (µs, the node's clock): idle ones are forgotten.
        self.used: dict[tuple[str, str], int] = {}

    def session(self, peer: str, kind: str = "main", now_us: int = 0) -> Session:
        key = (peer, kind)
        s = self.get(key)
        if s is None:
            s = self[key] = Session()
        if now_us:
            self.used[key] = now_us
        return s

    def expire(self, now_us: int, idle_us: int, keep: Callable[[str], bool]) -> int:
        """Forget sessions that sent nothing for ``idle_us`` toward a peer that ``keep`` does not
        hold (a later message starts a new session; the receiver forgot the old one by then)."""
        old = [k for k in self if now_us - self.used.get(k, now_us) > idle_us and not keep(k[0])]
        for k in old:
            del self[k]
            self.used.pop(k, None)
        return len(old)


__all__ = [
    "Broadcast",
    "FileSent",
    "Key",
    "ReceivedFile",
    "Reply",
    "Sent",
    "Sessions",
    "dumps",
    "error_fields",
    "error_payload",
]
