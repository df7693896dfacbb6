"""Peer faults: the other side sent something wrong.

A :class:`ProtocolError` is malformed input and closes the connection it came
on with its ``close_code``; a :class:`MessageRejected` is a well-formed message
that failed a check: it is refused and counted, and the connection goes on.
``reason`` names the check (a row of :data:`~iac.errors.REASONS`).
"""

from __future__ import annotations

from iac.errors.base import CloseCode, IacError


class PeerError(IacError):
    """The remote side sent something that breaks the protocol or fails a check, or cannot do
    what was asked (``mcp_unsupported``: its HELLO does not announce MCP over IAC)."""

    name = "peer_error"


class ProtocolError(PeerError):
    """Malformed input (a frame, its compression, the field-8 scan, the protobuf parse, a DICT
    frame). The connection it arrived on is closed with ``close_code``."""

    name = "protocol_error"

    @property
    def close_code(self) -> CloseCode:
        """The code the connection is closed with (the reason's row)."""
        return self.row.close or CloseCode.PROTOCOL_ERROR


class HandshakeError(ProtocolError):
    """A HELLO failed a check (``wrong_peer``, ``stale_hello``, ``admission_denied``, …); the
    connection is closed with the reason's close code."""

    name = "handshake_failed"


class MessageRejected(PeerError):
    """A well-formed message failed a check. It is refused and counted; the connection goes on.

    ``mismatched`` lists the inner-header fields that differ for ``sealed_header_mismatch``
    (someone put another message's ciphertext in a message of their own).
    """

    name = "message_rejected"

    def __init__(
        self, message: str = "", *, reason: str | None = None, mismatched: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, reason=reason)
        self.mismatched = mismatched


class FileTransferError(MessageRejected):
    """A FILE_TRANSFER payload or chunk was refused.

    ``fatal`` says whether the transfer is over (the receiver answers with a
    ``failed`` ack) or only this chunk was refused (the sender sends it again
    after its timeout).
    """

    name = "file_transfer_error"

    def __init__(self, message: str, transfer_id: str = "", *, reason: str | None = None) -> None:
        super().__init__(message, reason=reason)
        self.transfer_id = transfer_id

    @property
    def fatal(self) -> bool:
        """The transfer is over (the reason's row)."""
        return self.row.fatal


class RoutingError(MessageRejected):
    """A FORWARD frame was refused by the routing checks or the relay policy."""

    name = "routing_error"


class McpBindingError(MessageRejected):
    """A payload of MCP over IAC that breaks the binding or its bounds. ``reason`` is the counter
    (``not_mcp``, ``bad_version``, ``bad_session``, ``too_large``, ``too_deep``, ``not_jsonrpc``)
    and ``code`` the JSON-RPC error code it is answered with (docs/PROTOCOL.md, section 23)."""

    name = "mcp_binding_error"

    def __init__(self, reason: str, message: str, code: int = -32600) -> None:
        super().__init__(message, reason=reason)
        self.code = code
