"""IAC: Inter & Intra Agent Communication.

Signed (Ed25519), dictionary-compressed (zstd) protobuf messages between AI agents, peer to peer
over QUIC, TLS/TCP and UNIX sockets. This module is what an agent author types: the
:class:`Node`, its configuration and policies, the values handlers get and callers receive, the
wire enums, and the errors people catch. Everything else lives in the layer packages (the API
reference, docs/reference/): :mod:`iac.errors`, :mod:`iac.wire`, :mod:`iac.protocol`,
:mod:`iac.stores`, :mod:`iac.transport`, :mod:`iac.node`, :mod:`iac.mesh`, :mod:`iac.testing`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from typing import Any

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
from iac.node.types import FileSent, ReceivedFile, Reply, Sent
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

#: Names that were importable from ``iac`` before the public surface was narrowed: they still
#: resolve, with a DeprecationWarning that says where they live now.
_MOVED: dict[str, str] = {
    **dict.fromkeys(
        [
            "AdmissionDenied",
            "AliasTaken",
            "BadChunkLength",
            "BadDictionary",
            "BadForwardPath",
            "BadRecord",
            "BadSignature",
            "BadTransferPayload",
            "BadVarint",
            "BufferExceeded",
            "ChannelBindingMismatch",
            "ChunkHashMismatch",
            "ChunkOutOfRange",
            "CloseCode",
            "CommitmentChanged",
            "CompressionError",
            "DecompressionBomb",
            "ERROR_CODES",
            "FieldRepeated",
            "FileExistsInInbox",
            "FileHashMismatch",
            "FileTooLarge",
            "FileTransferError",
            "FrameError",
            "FrameTooLarge",
            "HandshakeError",
            "HelloSignatureInvalid",
            "HopLimitExhausted",
            "Impersonation",
            "InvalidAgentId",
            "KeyEnded",
            "KeyFileError",
            "KeyRevoked",
            "KeyRotated",
            "LocalError",
            "MessageFormatError",
            "MessageRejected",
            "MissingContentSize",
            "NoRoute",
            "PeerError",
            "ProtocolError",
            "RecordExpired",
            "Refusal",
            "RegistryFull",
            "RelayDenied",
            "ReplayStoreFull",
            "ReplayedHello",
            "ReplayedMessage",
            "RotationRefused",
            "RoutingError",
            "RoutingLoop",
            "SealError",
            "SealHeaderMismatch",
            "SeenCacheFull",
            "SignatureFieldInvalid",
            "SignatureFieldMissing",
            "SignatureFieldRepeated",
            "SourceChanged",
            "StaleHello",
            "StaleMessage",
            "StaleSeq",
            "StoreUnavailable",
            "TooManyTransfers",
            "TrailingData",
            "TransferMismatch",
            "TruncatedFrame",
            "UncommittedSuccessor",
            "UnexpectedHello",
            "UnknownAgent",
            "UnknownDictionary",
            "UnknownFrameFlag",
            "UnknownFrameType",
            "UnsafeFileName",
            "WrongPeer",
        ],
        "iac.errors",
    ),
    **dict.fromkeys(
        ["KeyBook", "RegistryAddr", "RegistryService", "move_peer", "parse_registry", "registry_admission"],
        "iac.mesh",
    ),
    **dict.fromkeys(
        ["AckPayload", "AckStatus", "FileReceiver", "FileSender", "TransferProgress"], "iac.protocol.files"
    ),
    **dict.fromkeys(["MemoryRecordStore", "RecordStore"], "iac.protocol.record_store"),
    **dict.fromkeys(
        [
            "AgentRecord",
            "Revocation",
            "RotationStatement",
            "SignedRecord",
            "SignedRevocation",
            "SignedRotation",
            "decode_record",
            "key_digest",
            "open_record",
            "open_revocation",
            "open_rotation",
            "sign_record",
            "sign_revocation",
            "sign_rotation",
        ],
        "iac.protocol.records",
    ),
    **dict.fromkeys(
        ["KeyInfo", "KeyStatus", "RegistryConfig", "RegistryEntry", "RegistryState", "verify_entry"],
        "iac.protocol.registry",
    ),
    **dict.fromkeys(
        [
            "Delivered",
            "Duplicate",
            "GapReason",
            "GapSkipped",
            "Late",
            "ReorderBuffer",
            "ReorderConfig",
            "ReorderEvent",
        ],
        "iac.protocol.reorder",
    ),
    **dict.fromkeys(
        ["ReplayConfig", "ReplayGuard", "ReplayStore", "Verdict", "check_freshness", "serial_diff"],
        "iac.protocol.replay",
    ),
    **dict.fromkeys(
        ["RouteDecision", "RouteRefusal", "Router", "open_forward", "wrap_forward"], "iac.protocol.routing"
    ),
    **dict.fromkeys(["MemoryReplayStore"], "iac.stores.memory"),
    **dict.fromkeys(["open_record_store"], "iac.stores.records"),
    **dict.fromkeys(["RedisRecordStore"], "iac.stores.records_redis"),
    **dict.fromkeys(["SqliteRecordStore"], "iac.stores.records_sqlite"),
    **dict.fromkeys(["RedisReplayStore"], "iac.stores.redis"),
    **dict.fromkeys(["SqliteReplayStore"], "iac.stores.sqlite"),
    **dict.fromkeys(["dial", "listen"], "iac.transport"),
    **dict.fromkeys(["Connection", "Incoming", "Listener", "PeerInfo"], "iac.transport.base"),
    **dict.fromkeys(["Attempt", "DialError", "Dialer"], "iac.transport.dialer"),
    **dict.fromkeys(["Dict", "Forward", "GoAway", "Hello", "Message"], "iac.wire._pb.iac_pb2"),
    **dict.fromkeys(["Dictionary", "DictionarySet", "default_dictionary", "train"], "iac.wire.dicts"),
    **dict.fromkeys(
        ["DEFAULT_MAX_FRAME_SIZE", "Frame", "FrameDecoder", "FrameType", "decode_frame", "encode_frame"],
        "iac.wire.frames",
    ),
    **dict.fromkeys(["Domain", "check_agent_id", "is_agent_id", "verify"], "iac.wire.identity"),
    **dict.fromkeys(
        [
            "FLAG_ACK_REQUESTED",
            "FLAG_ORDERED",
            "Session",
            "build_message",
            "decode_message_frame",
            "encode_message_frame",
            "open_hello",
            "open_message",
            "sender_of",
            "sign_hello",
            "sign_message",
            "unsigned_bytes",
        ],
        "iac.wire.message",
    ),
    **dict.fromkeys(["open_sealed", "seal_payload"], "iac.wire.seal"),
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'iac' has no attribute {name!r}")
    package = ".".join(module.split(".")[:2])
    warnings.warn(
        f"iac.{name} moved to {package}.{name}: import it from {package}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
