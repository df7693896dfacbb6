from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[MessageType]
    PING: _ClassVar[MessageType]
    BROADCAST: _ClassVar[MessageType]
    FILE_TRANSFER: _ClassVar[MessageType]
    COMMAND: _ClassVar[MessageType]
    DELEGATE_TASK: _ClassVar[MessageType]
    REGISTER_KEY: _ClassVar[MessageType]
    CREATE: _ClassVar[MessageType]
    TERMINATE: _ClassVar[MessageType]
    RUN: _ClassVar[MessageType]
    REPLY: _ClassVar[MessageType]
    ERROR: _ClassVar[MessageType]
    ACK: _ClassVar[MessageType]
    CANCEL: _ClassVar[MessageType]
    CREDIT: _ClassVar[MessageType]

class Intent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTENT_UNSPECIFIED: _ClassVar[Intent]
    ASSIGN_TASK: _ClassVar[Intent]
    PROVIDE_INFO: _ClassVar[Intent]
    REPORT_ERROR: _ClassVar[Intent]
    FINAL_RESULT: _ClassVar[Intent]
UNKNOWN: MessageType
PING: MessageType
BROADCAST: MessageType
FILE_TRANSFER: MessageType
COMMAND: MessageType
DELEGATE_TASK: MessageType
REGISTER_KEY: MessageType
CREATE: MessageType
TERMINATE: MessageType
RUN: MessageType
REPLY: MessageType
ERROR: MessageType
ACK: MessageType
CANCEL: MessageType
CREDIT: MessageType
INTENT_UNSPECIFIED: Intent
ASSIGN_TASK: Intent
PROVIDE_INFO: Intent
REPORT_ERROR: Intent
FINAL_RESULT: Intent

class TaskState(_message.Message):
    __slots__ = ("task_id", "intent", "step", "steps", "state_ref")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STATE_REF_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    intent: Intent
    step: int
    steps: int
    state_ref: str
    def __init__(self, task_id: _Optional[str] = ..., intent: _Optional[_Union[Intent, str]] = ..., step: _Optional[int] = ..., steps: _Optional[int] = ..., state_ref: _Optional[str] = ...) -> None: ...

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("to", "msg_type", "payload_json", "timestamp", "msg_id", "session_id", "signature", "extra_data", "reply_to", "task", "flags", "sealed", "reply_session_id", "deadline", "trace", "stream_seq", "credit", "principal")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_DATA_FIELD_NUMBER: _ClassVar[int]
    REPLY_TO_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    REPLY_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_SEQ_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    to: str
    msg_type: MessageType
    payload_json: str
    timestamp: int
    msg_id: int
    session_id: int
    signature: bytes
    extra_data: bytes
    reply_to: int
    task: TaskState
    flags: int
    sealed: bytes
    reply_session_id: int
    deadline: int
    trace: TraceContext
    stream_seq: int
    credit: int
    principal: str
    def __init__(self, to: _Optional[str] = ..., msg_type: _Optional[_Union[MessageType, str]] = ..., payload_json: _Optional[str] = ..., timestamp: _Optional[int] = ..., msg_id: _Optional[int] = ..., session_id: _Optional[int] = ..., signature: _Optional[bytes] = ..., extra_data: _Optional[bytes] = ..., reply_to: _Optional[int] = ..., task: _Optional[_Union[TaskState, _Mapping]] = ..., flags: _Optional[int] = ..., sealed: _Optional[bytes] = ..., reply_session_id: _Optional[int] = ..., deadline: _Optional[int] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ..., stream_seq: _Optional[int] = ..., credit: _Optional[int] = ..., principal: _Optional[str] = ..., **kwargs) -> None: ...

class Hello(_message.Message):
    __slots__ = ("version", "agent_id", "session_id", "timestamp", "nonce", "peer_nonce", "dict_ids", "max_frame_size", "listen_addrs", "capabilities", "channel_binding", "peer_agent_id", "signature")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PEER_NONCE_FIELD_NUMBER: _ClassVar[int]
    DICT_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_SIZE_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_BINDING_FIELD_NUMBER: _ClassVar[int]
    PEER_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    version: int
    agent_id: str
    session_id: int
    timestamp: int
    nonce: bytes
    peer_nonce: bytes
    dict_ids: _containers.RepeatedScalarFieldContainer[int]
    max_frame_size: int
    listen_addrs: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    channel_binding: bytes
    peer_agent_id: str
    signature: bytes
    def __init__(self, version: _Optional[int] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[int] = ..., timestamp: _Optional[int] = ..., nonce: _Optional[bytes] = ..., peer_nonce: _Optional[bytes] = ..., dict_ids: _Optional[_Iterable[int]] = ..., max_frame_size: _Optional[int] = ..., listen_addrs: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Iterable[str]] = ..., channel_binding: _Optional[bytes] = ..., peer_agent_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Forward(_message.Message):
    __slots__ = ("hop_limit", "path", "message", "origin", "origin_to_receiver")
    HOP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TO_RECEIVER_FIELD_NUMBER: _ClassVar[int]
    hop_limit: int
    path: _containers.RepeatedScalarFieldContainer[str]
    message: bytes
    origin: bytes
    origin_to_receiver: bytes
    def __init__(self, hop_limit: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., message: _Optional[bytes] = ..., origin: _Optional[bytes] = ..., origin_to_receiver: _Optional[bytes] = ...) -> None: ...

class Dict(_message.Message):
    __slots__ = ("dict_id", "sha256", "content")
    DICT_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    dict_id: int
    sha256: bytes
    content: bytes
    def __init__(self, dict_id: _Optional[int] = ..., sha256: _Optional[bytes] = ..., content: _Optional[bytes] = ...) -> None: ...

class GoAway(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
