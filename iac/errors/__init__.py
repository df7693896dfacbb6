"""One error tree for the whole library, organised by what a caller does about an error.

::

    IacError
    ├── LocalError          this side failed (a worker, the file being sent, a child process)
    │   ├── ConfigError     an argument, a configuration value or a key file is wrong: fix it
    │   └── DiskError       a file of this side cannot be read or written (``path``)
    ├── PeerError           the other side sent something wrong, or cannot do what was asked
    │   ├── ProtocolError   malformed input: that connection is closed (``close_code``)
    │   │   └── HandshakeError      a HELLO failed a check
    │   └── MessageRejected a well-formed message failed a check: refused, counted, the
    │       │               connection goes on
    │       ├── FileTransferError   a chunk or a transfer refused (``fatal``, ``transfer_id``)
    │       ├── RoutingError        a FORWARD refused by routing or the relay policy
    │       └── McpBindingError     MCP over IAC broke the binding (``code``: JSON-RPC)
    ├── TransportError      the network failed: retry, or try elsewhere
    │   ├── ConnectionClosed, DialError, DeliveryError, StoreUnavailable
    │   └── RequestTimeout  (also a ``TimeoutError``)
    ├── RemoteError         the peer answered a request with ERROR (``code``)
    │   └── TransferRefused
    └── HandlerError        a handler on this side answers a request with ERROR

Every error carries its fine ``reason`` (``stale_message``, ``wrong_peer``,
``routing_loop``, …): the one spelling that test vectors, logs, counters and
metrics use. :data:`REASONS` maps each reason to its class, the ERROR code it is
answered with, the close code of its connection and the counter it is counted
under. ``name`` is a class's own (default) reason.

The modules follow the tree: :mod:`~iac.errors.base` (the root, the close and
ERROR codes), :mod:`~iac.errors.local`, :mod:`~iac.errors.peer`,
:mod:`~iac.errors.transport`, :mod:`~iac.errors.answers` (refusals,
:class:`HandlerError`, :class:`RemoteError`) and :mod:`~iac.errors.reasons` (the
table). Import from ``iac.errors``; the split is for readers.
"""

from __future__ import annotations

from iac.errors.answers import HandlerError, Refusal, RemoteError, TransferRefused
from iac.errors.base import ERROR_CODES, CloseCode, ErrorCode, IacError, Reason
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
from iac.errors.reasons import REASONS, reasons_of
from iac.errors.transport import (
    Attempt,
    ConnectionClosed,
    DeliveryError,
    DialError,
    RequestTimeout,
    StoreUnavailable,
    TransportError,
)


def all_error_classes() -> list[type[IacError]]:
    """Every error class, root first (for docs and the reason table)."""
    out: list[type[IacError]] = []
    todo: list[type[IacError]] = [IacError]
    while todo:
        cls = todo.pop(0)
        if cls not in out:
            out.append(cls)
            todo.extend(cls.__subclasses__())
    return out


__all__ = [
    "ERROR_CODES",
    "REASONS",
    "Attempt",
    "CloseCode",
    "ConfigError",
    "ConnectionClosed",
    "DeliveryError",
    "DialError",
    "DiskError",
    "ErrorCode",
    "FileTransferError",
    "HandlerError",
    "HandshakeError",
    "IacError",
    "LocalError",
    "McpBindingError",
    "MessageRejected",
    "PeerError",
    "ProtocolError",
    "Reason",
    "Refusal",
    "RemoteError",
    "RequestTimeout",
    "RoutingError",
    "StoreUnavailable",
    "TransferRefused",
    "TransportError",
    "all_error_classes",
    "reasons_of",
]
