"""The wire layer, sans-IO: bytes to signed messages and back.

Frame codec and the streaming scanner, zstd dictionaries, the signing rule and
its field-8 scan, Ed25519 identities and sealed payloads. Nothing here does I/O
or reads a clock; it imports only :mod:`iac.errors`.
"""

from iac.wire._pb.iac_pb2 import Dict, Forward, GoAway, Hello, Message
from iac.wire.dicts import Dictionary, DictionarySet, default_dictionary, train
from iac.wire.enums import Intent, MessageType, message_type
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, Frame, FrameDecoder, FrameType, decode_frame, encode_frame
from iac.wire.identity import Domain, Identity, check_agent_id, is_agent_id, verify
from iac.wire.message import (
    FLAG_ACK_REQUESTED,
    FLAG_ORDERED,
    Session,
    build_message,
    decode_message_frame,
    encode_message_frame,
    open_hello,
    open_message,
    sender_of,
    sign_hello,
    sign_message,
    unsigned_bytes,
)
from iac.wire.seal import open_sealed, seal_payload
from iac.wire.task import TaskState

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ACK_REQUESTED",
    "FLAG_ORDERED",
    "Dict",
    "Dictionary",
    "DictionarySet",
    "Domain",
    "Forward",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "GoAway",
    "Hello",
    "Identity",
    "Intent",
    "Message",
    "MessageType",
    "Session",
    "TaskState",
    "build_message",
    "check_agent_id",
    "decode_frame",
    "decode_message_frame",
    "default_dictionary",
    "encode_frame",
    "encode_message_frame",
    "is_agent_id",
    "message_type",
    "open_hello",
    "open_message",
    "open_sealed",
    "seal_payload",
    "sender_of",
    "sign_hello",
    "sign_message",
    "train",
    "unsigned_bytes",
    "verify",
]
