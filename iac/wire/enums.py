"""The wire's enumerations as Python enums: ``list(MessageType)`` works, logs print names, and a
name or a number both resolve (``message_type("RUN") is message_type(9) is MessageType.RUN``).

The numbers are the wire format (docs/PROTOCOL.md, "Messages and the signing rule"); they equal
the generated protobuf enums value for value (a test holds them together). Protobuf fields take
them as the integers they are.
"""

from __future__ import annotations

from enum import IntEnum

from iac.errors import ConfigError


class MessageType(IntEnum):
    """``Message.msg_type``."""

    UNKNOWN = 0
    PING = 1
    BROADCAST = 2
    FILE_TRANSFER = 3
    COMMAND = 4
    DELEGATE_TASK = 5
    REGISTER_KEY = 6
    CREATE = 7
    TERMINATE = 8
    RUN = 9
    REPLY = 10
    ERROR = 11
    ACK = 12
    CANCEL = 13
    CREDIT = 14

    def __str__(self) -> str:
        return self.name


class Intent(IntEnum):
    """``TaskState.intent``: what a step of a delegated task is."""

    INTENT_UNSPECIFIED = 0
    ASSIGN_TASK = 1
    PROVIDE_INFO = 2
    REPORT_ERROR = 3
    FINAL_RESULT = 4

    def __str__(self) -> str:
        return self.name


#: Each MessageType by its number.
_BY_NUMBER: dict[int, MessageType] = {int(t): t for t in MessageType}


def message_type(value: int | str) -> MessageType:
    """A :class:`MessageType` from itself, its number or its name (any case); else ConfigError."""
    known = _BY_NUMBER.get(value) if type(value) is int else None  # a plain number: one lookup
    if known is not None:
        return known
    try:
        if isinstance(value, str):
            return MessageType[value.strip().upper()]
        return MessageType(value)
    except (KeyError, ValueError):
        names = ", ".join(t.name for t in MessageType if t)
        raise ConfigError(f"unknown message type {value!r}; use one of {names}") from None


def type_name(value: int) -> str:
    """The name of a msg_type number for logs and messages (the number itself when unknown)."""
    try:
        return MessageType(value).name
    except ValueError:
        return str(value)


__all__ = ["Intent", "MessageType", "message_type", "type_name"]
