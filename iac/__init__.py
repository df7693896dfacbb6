"""IAC: Inter & Intra Agent Communication.

Signed (Ed25519), dictionary-compressed (zstd) protobuf messages between AI agents, peer to peer
over QUIC, TLS/TCP and UNIX sockets. This module is what an agent author types: the
:class:`Node`, its configuration and policies, the values handlers get and callers receive, the
wire enums, and the errors people catch. Everything else lives in the layer packages (the API
reference, docs/reference/): :mod:`iac.errors`, :mod:`iac.wire`, :mod:`iac.protocol`,
:mod:`iac.stores`, :mod:`iac.transport`, :mod:`iac.node`, :mod:`iac.mesh`, :mod:`iac.testing`.
"""

from __future__ import annotations

import importlib.metadata

from iac.errors import (
    ConfigError,
    ConnectionClosed,
    DeliveryError,
    ErrorCode,
    HandlerError,
    IacError,
    RemoteError,
    RequestTimeout,
    TransferRefused,
    TransportError,
)
from iac.mesh import MeshClient, serve_registry
from iac.node.config import NodeConfig, NodeStats, PeerEvent, Topology
from iac.node.node import Context, Node
from iac.node.types import FileSent, ReceivedFile, Reply, SendOptions, Sent
from iac.protocol.guards import prompt_injection_guard
from iac.protocol.routing import RelayPolicy
from iac.transport.base import TransportConfig
from iac.transport.dialer import DialPolicy
from iac.wire.enums import Intent, MessageType
from iac.wire.identity import Identity
from iac.wire.task import TaskState

try:
    _installed = importlib.metadata.version("iac-mesh")
except importlib.metadata.PackageNotFoundError:  # a source checkout that is not installed
    _installed = "0+unknown"
#: The installed version of the distribution ``iac-mesh`` (``0+unknown`` in a checkout that is not
#: installed).
__version__ = _installed

__all__ = [
    "ConfigError",
    "ConnectionClosed",
    "Context",
    "DeliveryError",
    "DialPolicy",
    "ErrorCode",
    "FileSent",
    "HandlerError",
    "IacError",
    "Identity",
    "Intent",
    "MeshClient",
    "MessageType",
    "Node",
    "NodeConfig",
    "NodeStats",
    "PeerEvent",
    "ReceivedFile",
    "RelayPolicy",
    "RemoteError",
    "Reply",
    "RequestTimeout",
    "SendOptions",
    "Sent",
    "TaskState",
    "Topology",
    "TransferRefused",
    "TransportConfig",
    "TransportError",
    "__version__",
    "prompt_injection_guard",
    "serve_registry",
]


def __dir__() -> list[str]:
    return sorted(__all__)
