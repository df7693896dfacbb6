"""The protocol layer: state machines driven by messages and an explicit time.

Handshake, freshness and the replay window, ordered delivery, routing and
relays, file transfer, registry records and decisions, and the receive-pipeline
checks. Nothing here opens a socket or runs an event loop, and the state
machines take the time as an argument (:mod:`iac.protocol.clock` holds the
injectable clock that the adapters read). It builds on :mod:`iac.wire` and
:mod:`iac.errors`.
"""

from iac.protocol.clock import Clock, ManualClock, SystemClock
from iac.protocol.files import AckPayload, AckStatus, FileReceiver, FileSender, TransferProgress
from iac.protocol.guards import ContentGuard, prompt_injection_guard
from iac.protocol.record_store import MemoryRecordStore, RecordStore
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    decode_record,
    key_digest,
    open_record,
    open_revocation,
    open_rotation,
    sign_record,
    sign_revocation,
    sign_rotation,
)
from iac.protocol.registry import (
    KeyInfo,
    KeyStatus,
    RegistryConfig,
    RegistryEntry,
    RegistryState,
    verify_entry,
)
from iac.protocol.reorder import (
    Delivered,
    Duplicate,
    GapReason,
    GapSkipped,
    Late,
    ReorderBuffer,
    ReorderConfig,
    ReorderEvent,
)
from iac.protocol.replay import ReplayConfig, ReplayGuard, ReplayStore, Verdict, check_freshness, serial_diff
from iac.protocol.routing import RelayPolicy, RouteDecision, Router, RouteRefusal, open_forward, wrap_forward

__all__ = [
    "AckPayload",
    "AckStatus",
    "AgentRecord",
    "Clock",
    "ContentGuard",
    "Delivered",
    "Duplicate",
    "FileReceiver",
    "FileSender",
    "GapReason",
    "GapSkipped",
    "KeyInfo",
    "KeyStatus",
    "Late",
    "ManualClock",
    "MemoryRecordStore",
    "RecordStore",
    "RegistryConfig",
    "RegistryEntry",
    "RegistryState",
    "RelayPolicy",
    "ReorderBuffer",
    "ReorderConfig",
    "ReorderEvent",
    "ReplayConfig",
    "ReplayGuard",
    "ReplayStore",
    "Revocation",
    "RotationStatement",
    "RouteDecision",
    "RouteRefusal",
    "Router",
    "SignedRecord",
    "SignedRevocation",
    "SignedRotation",
    "SystemClock",
    "TransferProgress",
    "Verdict",
    "check_freshness",
    "decode_record",
    "key_digest",
    "open_forward",
    "open_record",
    "open_revocation",
    "open_rotation",
    "prompt_injection_guard",
    "serial_diff",
    "sign_record",
    "sign_revocation",
    "sign_rotation",
    "verify_entry",
    "wrap_forward",
]
