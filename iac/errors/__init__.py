"""One error tree for the whole library, split by whose fault it is.

::

    IacError
    ├── LocalError              you misused the API or the configuration is wrong
    │   ├── ConfigError, KeyFileError, SourceChanged, DiskError
    ├── PeerError               the other side sent something wrong
    │   ├── ProtocolError       malformed input: closes that connection (has close_code)
    │   │   ├── FrameError ...  framing, limits, compression
    │   │   ├── MessageFormatError ...  the field-8 scan and the protobuf parse
    │   │   └── HandshakeError ...      HELLO checks
    │   └── MessageRejected     a well-formed message that failed a check: refused,
    │       ├── BadSignature    counted, the connection goes on
    │       ├── InvalidAgentId
    │       ├── StaleMessage
    │       ├── ReplayedMessage, ReplayStoreFull
    │       ├── SealError → SealHeaderMismatch
    │       ├── BadRecord, StaleSeq, AliasTaken, KeyEnded → KeyRotated, KeyRevoked, ...
    │       └── FileTransferError ..., RoutingError ...
    ├── TransportError          the network failed (connect, reset, timeout)
    │   ├── ConnectionClosed, DialError, DeliveryError, RequestTimeout
    │   └── StoreUnavailable
    ├── RemoteError             the peer answered a request with ERROR
    │   └── TransferRefused
    └── HandlerError            a handler on this side answers a request with ERROR

Every class has a stable snake_case ``name`` that test vectors and logs use, so
another implementation can match errors without knowing Python class names.

The modules follow the tree: :mod:`~iac.errors.base` (the root and the close
codes), :mod:`~iac.errors.local`, :mod:`~iac.errors.peer`,
:mod:`~iac.errors.transport` and :mod:`~iac.errors.answers` (ERROR codes,
refusal reasons, :class:`HandlerError` and :class:`RemoteError`). Import from
``iac.errors``; the split is for readers.
"""

from __future__ import annotations

from iac.errors.answers import (
    ERROR_CODES,
    ErrorCode,
    HandlerError,
    Refusal,
    RemoteError,
    TransferRefused,
)
from iac.errors.base import (
    CloseCode,
    IacError,
)
from iac.errors.local import (
    ConfigError,
    DiskError,
    KeyFileError,
    LocalError,
    McpChildFailed,
    SourceChanged,
    WorkerFailed,
)
from iac.errors.peer import (
    AdmissionDenied,
    AliasTaken,
    BadChunkLength,
    BadDictionary,
    BadForwardPath,
    BadRecord,
    BadSignature,
    BadTransferPayload,
    BadVarint,
    BufferExceeded,
    ChannelBindingMismatch,
    ChunkHashMismatch,
    ChunkOutOfRange,
    CommitmentChanged,
    CompressionError,
    DecompressionBomb,
    FieldRepeated,
    FileExistsInInbox,
    FileHashMismatch,
    FileTooLarge,
    FileTransferError,
    FrameError,
    FrameTooLarge,
    HandshakeError,
    HelloSignatureInvalid,
    HopLimitExhausted,
    Impersonation,
    InvalidAgentId,
    KeyEnded,
    KeyRevoked,
    KeyRotated,
    McpBindingError,
    McpUnsupported,
    MessageFormatError,
    MessageRejected,
    MissingContentSize,
    NoRoute,
    PeerError,
    ProtocolError,
    RecordExpired,
    RegistryFull,
    RegistryQuota,
    RelayDenied,
    ReplayedHello,
    ReplayedMessage,
    ReplayStoreFull,
    RotationRefused,
    RoutingError,
    RoutingLoop,
    SealError,
    SealHeaderMismatch,
    SeenCacheFull,
    SignatureFieldInvalid,
    SignatureFieldMissing,
    SignatureFieldRepeated,
    StaleHello,
    StaleMessage,
    StaleSeq,
    StreamOverrun,
    TooManyTransfers,
    TrailingData,
    TransferMismatch,
    TruncatedFrame,
    UncommittedSuccessor,
    UnexpectedHello,
    UnknownAgent,
    UnknownDictionary,
    UnknownFrameFlag,
    UnknownFrameType,
    UnsafeFileName,
    WrongPeer,
    ZeroContentSize,
)
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
    """Every error class, root first (for docs and the test-vector name table)."""
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
    "AdmissionDenied",
    "AliasTaken",
    "Attempt",
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
    "ConfigError",
    "ConnectionClosed",
    "DecompressionBomb",
    "DeliveryError",
    "DialError",
    "DiskError",
    "ErrorCode",
    "FieldRepeated",
    "FileExistsInInbox",
    "FileHashMismatch",
    "FileTooLarge",
    "FileTransferError",
    "FrameError",
    "FrameTooLarge",
    "HandlerError",
    "HandshakeError",
    "HelloSignatureInvalid",
    "HopLimitExhausted",
    "IacError",
    "Impersonation",
    "InvalidAgentId",
    "KeyEnded",
    "KeyFileError",
    "KeyRevoked",
    "KeyRotated",
    "LocalError",
    "McpBindingError",
    "McpChildFailed",
    "McpUnsupported",
    "MessageFormatError",
    "MessageRejected",
    "MissingContentSize",
    "NoRoute",
    "PeerError",
    "ProtocolError",
    "RecordExpired",
    "Refusal",
    "RegistryFull",
    "RegistryQuota",
    "RelayDenied",
    "RemoteError",
    "ReplayStoreFull",
    "ReplayedHello",
    "ReplayedMessage",
    "RequestTimeout",
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
    "StreamOverrun",
    "TooManyTransfers",
    "TrailingData",
    "TransferMismatch",
    "TransferRefused",
    "TransportError",
    "TruncatedFrame",
    "UncommittedSuccessor",
    "UnexpectedHello",
    "UnknownAgent",
    "UnknownDictionary",
    "UnknownFrameFlag",
    "UnknownFrameType",
    "UnsafeFileName",
    "WorkerFailed",
    "WrongPeer",
    "ZeroContentSize",
    "all_error_classes",
]
