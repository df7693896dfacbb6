"""The root of the error tree and the connection close codes."""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class CloseCode(IntEnum):
    """Connection close codes (QUIC application error codes; GOAWAY codes on TCP/UNIX)."""

    NO_ERROR = 0x00
    PROTOCOL_ERROR = 0x01
    FRAME_TOO_LARGE = 0x02
    UNKNOWN_FRAME_TYPE = 0x03
    UNKNOWN_FRAME_FLAG = 0x04
    TRUNCATED_FRAME = 0x05
    BAD_COMPRESSION = 0x06
    UNKNOWN_DICTIONARY = 0x07
    MALFORMED_MESSAGE = 0x08
    BUFFER_EXCEEDED = 0x09
    BAD_DICTIONARY = 0x0A
    HANDSHAKE_FAILED = 0x10
    BAD_HELLO_SIGNATURE = 0x11
    WRONG_PEER = 0x12
    STALE_HELLO = 0x13
    REPLAYED_HELLO = 0x14
    CHANNEL_BINDING = 0x15
    ADMISSION_DENIED = 0x16
    UNEXPECTED_HELLO = 0x17
    IMPERSONATION = 0x18
    IDLE_TIMEOUT = 0x20
    GOING_AWAY = 0x21
    DUPLICATE_IDENTITY = 0x22
    INTERNAL_ERROR = 0x7F


class IacError(Exception):
    """Root of every error this library raises."""

    name: ClassVar[str] = "iac_error"
