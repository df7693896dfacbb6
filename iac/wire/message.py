"""Building, signing and verifying ``iac.Message`` (sans-IO: time is an argument).

Signing serializes the message with ``signature`` empty and signs
``iac-msg-v1 || 0x00 || those bytes``. Verification never re-serializes: it
removes field 8 from the received bytes (:func:`iac.wire.scan.excise_signature`)
and verifies over what is left.
"""

from __future__ import annotations

import secrets

from google.protobuf.message import DecodeError

from iac.errors import ConfigError, ProtocolError
from iac.wire._pb.iac_pb2 import Hello, Message, TaskState
from iac.wire.dicts import Dictionary, DictionarySet
from iac.wire.enums import MessageType
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, FrameType, decode_frame_body, encode_frame
from iac.wire.identity import Domain, Identity, check_agent_id, check_agent_id_cached, verify, verify_signed
from iac.wire.scan import HELLO_SCHEMA, MESSAGE_SCHEMA, SIGNATURE_SIZE, excise_signature, signature_span

#: ``Message.flags`` bit: the sender wants an ACK and retransmits until it gets one.
FLAG_ACK_REQUESTED = 0x1
#: ``Message.flags`` bit: deliver in order within the session.
FLAG_ORDERED = 0x2
#: A request that wants a streamed answer, and each part of it; the last part of a stream.
FLAG_STREAM = 0x4
FLAG_END = 0x8
U64 = 1 << 64


class Session:
    """A sender's session toward one peer: a random 64-bit id and a msg_id counter.

    Counters wrap modulo 2**64 (receivers compare with serial arithmetic).
    """

    __slots__ = ("_next", "session_id")

    def __init__(self, session_id: int | None = None, first_msg_id: int = 1) -> None:
        if session_id is None:
            session_id = secrets.randbits(64) or 1
        if not 0 <= session_id < U64 or not 0 <= first_msg_id < U64:
            raise ConfigError("session_id and msg_id are unsigned 64-bit integers")
        self.session_id = session_id
        self._next = first_msg_id

    def next_msg_id(self) -> int:
        msg_id = self._next
        self._next = (msg_id + 1) % U64
        return msg_id

    def __repr__(self) -> str:
        return f"Session(session_id={self.session_id:#018x}, next_msg_id={self._next})"


def build_message(
    *,
    sender: str,
    to: str,
    msg_type: int,
    session: Session,
    timestamp_us: int,
    payload_json: str = "",
    extra_data: bytes = b"",
    reply_to: int = 0,
    reply_session_id: int = 0,
    task: TaskState | None = None,
    flags: int = 0,
    sealed: bytes = b"",
    deadline_us: int = 0,
    msg_id: int | None = None,
) -> Message:
    """A new unsigned Message with the next msg_id of ``session``."""
    check_agent_id_cached(sender)
    if to:
        check_agent_id_cached(to)
    msg = Message(
        to=to,
        msg_type=msg_type,  # type: ignore[arg-type]
        payload_json=payload_json,
        timestamp=timestamp_us,
        msg_id=session.next_msg_id() if msg_id is None else msg_id,
        session_id=session.session_id,
        **{"from": sender},  # type: ignore[arg-type]  # a Python keyword: given by name
    )
    # Optional fields are set only when used: passing defaults to the constructor costs ~0.3 µs.
    if extra_data:
        msg.extra_data = extra_data
    if reply_to:
        msg.reply_to = reply_to
    if flags:
        msg.flags = flags
    if sealed:
        msg.sealed = sealed
    if reply_session_id:
        msg.reply_session_id = reply_session_id
    if deadline_us:
        msg.deadline = deadline_us
    if task is not None:
        msg.task.CopyFrom(task)
    return msg


def sender_of(msg: Message) -> str:
    """The ``from`` field (a Python keyword, so not an attribute)."""
    value: str = getattr(msg, "from")
    return value


def unsigned_bytes(msg: Message) -> bytes:
    """The bytes that are signed: the message serialized with ``signature`` empty."""
    saved = msg.signature
    msg.signature = b""
    try:
        return msg.SerializeToString(deterministic=True)
    finally:
        msg.signature = saved


def sign_message(identity: Identity, msg: Message) -> bytes:
    """Sign ``msg`` in place (sets ``signature``) and return the signed bytes."""
    if getattr(msg, "from") != identity.agent_id:
        raise ConfigError("a message must be signed by the identity in its `from` field")
    if msg.signature:
        msg.signature = b""
    msg.signature = identity.sign(Domain.MESSAGE, msg.SerializeToString(deterministic=True))
    return msg.SerializeToString(deterministic=True)


def open_message(data: bytes) -> Message:
    """Parse and verify signed Message bytes; return the message.

    Order: field-8 scan, protobuf parse, ``from`` is a valid AgentId, signature.
    Raises ``malformed_message`` (closes the connection), or
    ``invalid_agent_id`` / ``bad_signature`` (the message is refused).
    """
    s, e = signature_span(data, MESSAGE_SCHEMA)
    try:
        msg = Message.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"Message does not parse: {exc}", reason="malformed_message") from None
    mv = memoryview(data)
    # one copy: signature || "iac-msg-v1" 0x00 || the bytes around field 8 (what libsodium's open takes)
    verify_signed(getattr(msg, "from"), b"".join((mv[e - SIGNATURE_SIZE : e], _MSG_PREFIX, mv[:s], mv[e:])))
    return msg


_MSG_PREFIX = Domain.MESSAGE.value + b"\x00"


def encode_message_frame(
    identity: Identity,
    msg: Message,
    *,
    compress_with: Dictionary | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> bytes:
    """Sign ``msg`` and wrap it in a MESSAGE frame (zstd with the dictionary, if it helps)."""
    return encode_frame(
        FrameType.MESSAGE,
        sign_message(identity, msg),
        compress_with=compress_with,
        max_frame_size=max_frame_size,
    )


def decode_message_frame(
    data: bytes,
    *,
    dictionaries: DictionarySet | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> Message:
    """Decode one MESSAGE frame and verify the message inside."""
    ftype, body = decode_frame_body(data, dictionaries or _NO_DICTIONARIES, max_frame_size)
    if ftype is not FrameType.MESSAGE:
        raise ProtocolError(f"expected a MESSAGE frame, got {ftype.name}", reason="malformed_message")
    return open_message(body)


_NO_DICTIONARIES = DictionarySet()


def sign_hello(identity: Identity, hello: Hello, domain: Domain) -> bytes:
    """Sign a HELLO (field 15 excised as field 8 is for messages); return its bytes."""
    if domain not in (Domain.HELLO_CLIENT, Domain.HELLO_SERVER):
        raise ConfigError("a HELLO is signed in a hello domain")
    hello.signature = b""
    hello.signature = identity.sign(domain, hello.SerializeToString(deterministic=True))
    return hello.SerializeToString(deterministic=True)


def open_hello(data: bytes, domain: Domain) -> Hello:
    """Parse a HELLO and verify its signature by its own ``agent_id`` in ``domain``."""
    unsigned, signature = excise_signature(data, HELLO_SCHEMA)
    try:
        hello = Hello.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"Hello does not parse: {exc}", reason="malformed_message") from None
    verify(check_agent_id(hello.agent_id), domain, unsigned, signature)
    return hello


__all__ = [
    "FLAG_ACK_REQUESTED",
    "FLAG_END",
    "FLAG_ORDERED",
    "FLAG_STREAM",
    "Hello",
    "Message",
    "MessageType",
    "Session",
    "TaskState",
    "build_message",
    "decode_message_frame",
    "encode_message_frame",
    "open_hello",
    "open_message",
    "sender_of",
    "sign_hello",
    "sign_message",
    "unsigned_bytes",
]
