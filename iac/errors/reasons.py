"""The reason table: every reason an error, a log line, a counter or a metric names, spelled once.

A row gives the class an error of that reason is raised as, the ERROR code a refused message is
answered with, the code a connection is closed with, and the key the node's counters count it
under (``NodeStats.refused``, ``route_refused``, ``file_refused``; the reason itself, or the
family it is counted with). The names are the protocol's: test vectors and the protocol document
use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from iac.errors.answers import HandlerError, RemoteError, TransferRefused
from iac.errors.base import ROWS, CloseCode, ErrorCode, IacError, Reason
from iac.errors.local import ConfigError, DiskError, LocalError
from iac.errors.peer import (
    FileTransferError,
    HandshakeError,
    McpBindingError,
    MessageRejected,
    PeerError,
    ProtocolError,
    RoutingError,
)
from iac.errors.transport import (
    ConnectionClosed,
    DeliveryError,
    DialError,
    RequestTimeout,
    StoreUnavailable,
    TransportError,
)

_B, _C = ErrorCode, CloseCode


def _rows() -> list[Reason]:
    own: list[type[IacError]] = [IacError, LocalError, DiskError, PeerError, TransportError]
    own += [ConnectionClosed, DialError, DeliveryError, RequestTimeout]
    own += [HandlerError, RemoteError, TransferRefused]
    rows = [Reason(c.name, c) for c in own]
    rows += [Reason(n, LocalError) for n in ("worker_failed", "source_changed", "mcp_child_failed")]
    rows += [Reason("invalid_transition", LocalError)]
    rows += [Reason("stateless_reset", ConnectionClosed)]  # the peer no longer knows the connection
    rows += [Reason(n, ConfigError) for n in ("config_error", "key_file_error")]
    rows += [Reason("mcp_unsupported", PeerError)]
    # Protocol errors: the connection is closed.
    protocol = {
        "protocol_error": _C.PROTOCOL_ERROR,
        "frame_error": _C.PROTOCOL_ERROR,
        "frame_too_large": _C.FRAME_TOO_LARGE,
        "unknown_frame_type": _C.UNKNOWN_FRAME_TYPE,
        "unknown_frame_flag": _C.UNKNOWN_FRAME_FLAG,
        "truncated_frame": _C.TRUNCATED_FRAME,
        "bad_varint": _C.PROTOCOL_ERROR,
        "compression_error": _C.BAD_COMPRESSION,
        "missing_content_size": _C.BAD_COMPRESSION,
        "zero_content_size": _C.BAD_COMPRESSION,
        "trailing_data": _C.BAD_COMPRESSION,
        "decompression_bomb": _C.FRAME_TOO_LARGE,
        "unknown_dictionary": _C.UNKNOWN_DICTIONARY,
        "buffer_exceeded": _C.BUFFER_EXCEEDED,
        "bad_dictionary": _C.BAD_DICTIONARY,
        "impersonation": _C.IMPERSONATION,
    }
    rows += [Reason(n, ProtocolError, close=c, counter=n) for n, c in protocol.items()]
    malformed = ["malformed_message", "signature_missing", "signature_repeated"]
    malformed += ["signature_invalid", "field_repeated"]
    rows += [
        Reason(n, ProtocolError, close=_C.MALFORMED_MESSAGE, counter="malformed_message") for n in malformed
    ]
    handshake = {
        "handshake_failed": _C.HANDSHAKE_FAILED,
        "hello_bad_signature": _C.BAD_HELLO_SIGNATURE,
        "wrong_peer": _C.WRONG_PEER,
        "stale_hello": _C.STALE_HELLO,
        "replayed_hello": _C.REPLAYED_HELLO,
        "channel_binding_mismatch": _C.CHANNEL_BINDING,
        "admission_denied": _C.ADMISSION_DENIED,
        "unexpected_hello": _C.UNEXPECTED_HELLO,
    }
    rows += [Reason(n, HandshakeError, close=c, counter=n) for n, c in handshake.items()]
    # Refusals of the receive pipeline (NodeStats.refused), in pipeline order.
    refused: dict[str, ErrorCode | None] = {
        "message_rejected": None,
        "bad_signature": _B.BAD_SIGNATURE,
        "stale_message": _B.BAD_REQUEST,
        "replayed_message": None,
        "duplicate": None,
        "replay_store_full": _B.BUSY,
        "before_history": _B.BUSY,
        "not_addressed": _B.POLICY_DENIED,
        "forward_not_relayed": None,
        "policy_denied": _B.POLICY_DENIED,
        "unseal_failed": _B.BAD_REQUEST,
        "sealed_header_mismatch": _B.UNAUTHORIZED,
        "bad_type": _B.BAD_REQUEST,
        "bad_payload": _B.BAD_REQUEST,
        "bad_task": _B.BAD_REQUEST,
        "delegation_denied": _B.UNAUTHORIZED,
        "deadline_passed": _B.TIMEOUT,
        "content_blocked": _B.CONTENT_BLOCKED,
        "no_handler": _B.NO_HANDLER,
        "bad_call": _B.BAD_REQUEST,
        "busy": _B.BUSY,
        "unmatched_response": None,
        "stream_overrun": None,
    }
    rows += [Reason(n, MessageRejected, error=c, counter=n) for n, c in refused.items()]
    rows += [Reason("invalid_agent_id", MessageRejected, _B.BAD_SIGNATURE, counter="bad_signature")]
    rows += [Reason("store_unavailable", StoreUnavailable, _B.BUSY, counter="store_unavailable")]
    rows += [Reason("file_transfer", FileTransferError, _B.BAD_REQUEST, counter="file_transfer")]
    # Registry records, key rotation and revocation (answered by a registry as ERROR).
    registry = ["bad_record", "record_expired", "stale_seq", "alias_taken", "commitment_changed"]
    registry += ["uncommitted_successor", "rotation_refused", "unknown_agent", "key_ended"]
    registry += ["key_rotated", "key_revoked", "registry_full"]
    rows += [Reason(n, MessageRejected, _B.BAD_REQUEST) for n in registry]
    rows += [Reason("registry_quota", MessageRejected, _B.BUSY)]
    # File transfer (NodeStats.file_refused counts them by reason).
    files = {
        "file_transfer_error": False,
        "bad_transfer_payload": True,
        "unsafe_file_name": True,
        "file_too_large": True,
        "transfer_mismatch": True,
        "chunk_out_of_range": False,
        "bad_chunk_length": False,
        "chunk_hash_mismatch": False,
        "file_hash_mismatch": True,
        "file_exists": True,
    }
    rows += [Reason(n, FileTransferError, _B.BAD_REQUEST, counter=n, fatal=f) for n, f in files.items()]
    rows += [Reason("too_many_transfers", FileTransferError, _B.BUSY, counter="too_many_transfers")]
    # Relayed routing (NodeStats.route_refused; answered only by the destination, see the doc).
    routing = {
        "routing_error": None,
        "hop_limit_exhausted": _B.BAD_REQUEST,
        "routing_loop": _B.BAD_REQUEST,
        "bad_forward_path": _B.BAD_REQUEST,
        "relay_denied": _B.POLICY_DENIED,
        "relay_rate": _B.BUSY,
        "no_route": _B.BAD_REQUEST,
        "seen_cache_full": _B.BUSY,
    }
    rows += [Reason(n, RoutingError, c, counter=n) for n, c in routing.items()]
    # MCP over IAC (counted by the bridge and the endpoint, answered with a JSON-RPC error).
    mcp = ("mcp_binding_error", "not_mcp", "bad_version", "bad_session", "too_large", "too_deep")
    rows += [Reason(n, McpBindingError, counter=n) for n in (*mcp, "not_jsonrpc")]
    return rows


ROWS.update({r.name: r for r in _rows()})
#: Every reason, by name: ``REASONS[err.reason]`` is the row of an error.
REASONS: Mapping[str, Reason] = MappingProxyType(ROWS)


def reasons_of(cls: type[IacError]) -> list[str]:
    """The reasons an error of ``cls`` (exactly that class) is raised with."""
    return [r.name for r in REASONS.values() if r.cls is cls]
