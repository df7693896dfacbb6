"""The root of the error tree, the connection close codes and the ERROR codes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
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


class ErrorCode(StrEnum):
    """The closed list of ERROR codes (``{"code": ..., "message": ...}`` in ``payload_json``)."""

    NO_HANDLER = "no_handler"  # no handler for this msg_type, or the remote call name is not exposed
    TIMEOUT = "timeout"  # the request's deadline passed before it was started, or while it ran
    UNAUTHORIZED = "unauthorized"  # the sender may not do this (delegation allow-list, sealed header)
    BAD_SIGNATURE = "bad_signature"  # the signature (or the `from` AgentId) did not verify
    POLICY_DENIED = (
        "policy_denied"  # topology policy; a MESSAGE frame addressed elsewhere (relays take FORWARD)
    )
    CONTENT_BLOCKED = "content_blocked"  # a content guard refused the payload
    BAD_REQUEST = "bad_request"  # schema: type, JSON, task envelope, call shape, stale timestamp
    BUSY = "busy"  # a bound is hit (handler backlog, per-peer quota, replay store, draining)
    CANCELLED = "cancelled"  # the caller sent CANCEL
    INTERNAL = "internal"  # the handler raised something else


#: The closed list of ERROR codes as strings (the values of :class:`ErrorCode`).
ERROR_CODES: frozenset[str] = frozenset(c.value for c in ErrorCode)


class IacError(Exception):
    """Root of every error this library raises.

    The class says what a caller does about the error; ``reason`` says exactly what went wrong,
    as the stable snake_case name that test vectors, logs, counters and metrics use (one row of
    :data:`~iac.errors.REASONS` each). ``name`` is the class's own reason, the default.
    """

    name: ClassVar[str] = "iac_error"

    def __init__(self, message: str = "", *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason: str = reason or self.name

    @property
    def row(self) -> Reason:
        """This error's row of the reason table (the class's own row for an unknown reason)."""
        return ROWS.get(self.reason) or ROWS[self.name]


@dataclass(frozen=True, slots=True)
class Reason:
    """One row of :data:`~iac.errors.REASONS`.

    Attributes:
        name: the reason, snake_case (``err.reason``, log ``reason`` fields, counter keys).
        cls: the class an error of this reason is raised as.
        error: the ERROR code a refused message is answered with (None: not answered, or not
            a refusal of a message).
        close: the code the connection is closed with (protocol errors only).
        counter: the counter key it is counted under: ``name`` itself, the family it is counted
            with (``invalid_agent_id`` counts as ``bad_signature``), or None when not counted.
        fatal: a file-transfer refusal that ends the transfer (a ``failed`` ack).
    """

    name: str
    cls: type[IacError]
    error: ErrorCode | None = None
    close: CloseCode | None = None
    counter: str | None = None
    fatal: bool = False


#: The rows by reason, filled once by :mod:`iac.errors.reasons` (read it as ``REASONS``).
ROWS: dict[str, Reason] = {}
