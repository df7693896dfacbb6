"""A2A over IAC, the binding itself (docs/PROTOCOL.md, "A2A over IAC"): how an A2A call and its
answers are written into IAC messages, and how an agent card names an IAC endpoint. Sans-IO: no
node, no socket, no clock; the client transport, the server, the gateway and the bridge use it.

* A call is a RUN request flagged STREAM whose ``payload_json`` is
  ``{"a2a": "1.0", "method": "SendMessage", "params": {...}}`` -- the A2A JSON-RPC method name
  and its params in the ProtoJSON form A2A's JSON-RPC binding uses (``extensions``, a list of
  extension URIs, may follow).
* Every answer part is ``{"result": ...}`` or ``{"error": {"code", "message", "data"}}``, the
  JSON-RPC response members (the request's ids are IAC's ``reply_to``). A unary method answers
  one part, a streaming one a part per event; then END.
* An agent card lists the binding as ``AgentInterface(protocol_binding="IAC",
  protocol_version="1.0", url="iac://AGENT_ID?addr=quic://…&addr=tls://…")``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

try:
    from a2a.client.errors import A2AClientError
    from a2a.extensions.common import get_requested_extensions
    from a2a.types import a2a_pb2 as pb
    from a2a.utils.error_handlers import build_error_details
    from a2a.utils.errors import (
        JSON_RPC_ERROR_CODE_MAP,
        A2AError,
        InvalidAgentResponseError,
        InvalidParamsError,
        InvalidRequestError,
        MethodNotFoundError,
        VersionNotSupportedError,
    )
    from google.protobuf.json_format import MessageToDict, ParseDict
    from google.protobuf.message import Message as ProtoMessage
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("iac.integrations.a2a needs a2a-sdk: pip install 'iac-mesh[a2a]'") from exc

from iac.errors import ConfigError, IacError
from iac.transport.base import parse_address
from iac.wire.enums import MessageType
from iac.wire.identity import check_agent_id

#: ``AgentInterface.protocol_binding`` of the binding.
BINDING = "IAC"
#: The A2A protocol versions the binding carries (major.minor), preferred first.
VERSIONS = ("1.0",)
VERSION = VERSIONS[0]
"""The A2A protocol version the binding prefers (the first of ``VERSIONS``)."""
#: The IAC message type that carries A2A calls.
MSG_TYPE = MessageType.RUN
#: The binding's own method: the agent's public card (what an HTTP agent serves at its
#: well-known path; an IAC endpoint has no path).
GET_AGENT_CARD = "GetAgentCard"
#: Longest principal (UTF-8 bytes) a gateway may name in Message field 19.
MAX_PRINCIPAL = 256
#: Most addresses an ``iac://`` URL may list.
MAX_ADDRESSES = 16
#: ``ClientCallContext.state`` key of the principal a gateway forwards a call for.
PRINCIPAL_STATE = "iac_principal"
_SCHEME = "iac"


@dataclass(frozen=True, slots=True)
class Method:
    """An A2A method: its params type, what a ``result`` decodes into (None: no result), and
    whether it streams."""

    name: str
    params: type[ProtoMessage]
    result: type[ProtoMessage] | None
    streaming: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("SendMessage", pb.SendMessageRequest, pb.SendMessageResponse),
        Method("SendStreamingMessage", pb.SendMessageRequest, pb.StreamResponse, streaming=True),
        Method("GetTask", pb.GetTaskRequest, pb.Task),
        Method("ListTasks", pb.ListTasksRequest, pb.ListTasksResponse),
        Method("CancelTask", pb.CancelTaskRequest, pb.Task),
        Method("SubscribeToTask", pb.SubscribeToTaskRequest, pb.StreamResponse, streaming=True),
        Method(
            "CreateTaskPushNotificationConfig", pb.TaskPushNotificationConfig, pb.TaskPushNotificationConfig
        ),
        Method(
            "GetTaskPushNotificationConfig",
            pb.GetTaskPushNotificationConfigRequest,
            pb.TaskPushNotificationConfig,
        ),
        Method(
            "ListTaskPushNotificationConfigs",
            pb.ListTaskPushNotificationConfigsRequest,
            pb.ListTaskPushNotificationConfigsResponse,
        ),
        Method("DeleteTaskPushNotificationConfig", pb.DeleteTaskPushNotificationConfigRequest, None),
        Method("GetExtendedAgentCard", pb.GetExtendedAgentCardRequest, pb.AgentCard),
        Method(GET_AGENT_CARD, pb.GetExtendedAgentCardRequest, pb.AgentCard),
    )
}

_CODE_TO_ERROR: dict[int, type[A2AError]] = {code: cls for cls, code in JSON_RPC_ERROR_CODE_MAP.items()}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class IacBindingError(A2AClientError):
    """An A2A call over IAC failed below A2A: the peer could not be reached, refused the call with
    an IAC ERROR (``code``: ``no_handler``, ``unauthorized``, ``busy``, …) or broke the binding.

    ``code`` is ``wrong_peer`` when the agent card's IAC interface names an AgentId that is not
    the one the peer proved (its HELLO, or the signature of what it answered).
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Call:
    """A decoded call: the method, its params, the A2A version and the extensions asked for."""

    method: Method
    params: ProtoMessage
    version: str
    extensions: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What an ``iac://`` interface URL names: an AgentId and the addresses to dial it at."""

    agent_id: str
    addresses: tuple[str, ...]


# --- calls ------------------------------------------------------------------------------------


def call_payload(
    method: str, params: ProtoMessage, *, version: str = VERSION, extensions: Sequence[str] = ()
) -> dict[str, Any]:
    """The ``payload_json`` object of a call."""
    if method not in METHODS:
        raise ConfigError(f"{method!r} is not an A2A method of the IAC binding")
    out: dict[str, Any] = {"a2a": version, "method": method, "params": MessageToDict(params)}
    if extensions:
        out["extensions"] = sorted(extensions)
    return out


def parse_call(payload: Any) -> Call:
    """Decode a call; raises the A2A error a JSON-RPC server answers for the same fault:
    ``InvalidRequestError`` (not a call object), ``VersionNotSupportedError``,
    ``MethodNotFoundError``, ``InvalidParamsError`` (params that are not the method's)."""
    if not isinstance(payload, dict):
        raise InvalidRequestError(message="an A2A call over IAC is a JSON object")
    version = payload.get("a2a")
    method_name = payload.get("method")
    params = payload.get("params", {})
    if not isinstance(version, str) or not isinstance(method_name, str):
        raise InvalidRequestError(message="an A2A call over IAC names its version (a2a) and method")
    if not supported_version(version):
        raise VersionNotSupportedError(
            message=f"A2A version {version[:20]!r} is not carried here; this side speaks "
            + ", ".join(VERSIONS)
        )
    method = METHODS.get(method_name)
    if method is None:
        raise MethodNotFoundError(message=f"no A2A method {method_name[:64]!r}")
    if not isinstance(params, dict):
        raise InvalidParamsError(message="params is not an object")
    try:
        message = ParseDict(params, method.params(), ignore_unknown_fields=True)
    except Exception as exc:  # ParseError, and the TypeError/ValueError it lets through
        raise InvalidParamsError(data={"parseError": str(exc)[:200]}) from None
    ext = payload.get("extensions", [])
    if not isinstance(ext, list) or not all(isinstance(e, str) for e in ext):
        raise InvalidRequestError(message="extensions is not a list of URIs")
    return Call(method, message, version, frozenset(get_requested_extensions(ext)))


def supported_version(version: str) -> bool:
    """True when ``version`` (``major.minor``, a patch level ignored) is one the binding carries."""
    head = ".".join(version.split(".")[:2])
    return head in VERSIONS


# --- answers ----------------------------------------------------------------------------------


def result_payload(result: ProtoMessage | Mapping[str, Any] | None) -> dict[str, Any]:
    """An answer part that carries a result (a message, an already serialized one, or none)."""
    if isinstance(result, ProtoMessage):
        return {"result": MessageToDict(result)}
    return {"result": dict(result) if result is not None else None}


def error_payload(error: A2AError) -> dict[str, Any]:
    """An answer part that carries an A2A error, as JSON-RPC writes it."""
    code = JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603)
    return {"error": {"code": code, "message": str(error)[:1000], "data": build_error_details(error)}}


def answer_error(payload: Any) -> A2AError | None:
    """The A2A error an answer part carries, or None for a result part."""
    if not isinstance(payload, dict) or "error" not in payload:
        return None
    err = payload["error"]
    if not isinstance(err, dict):
        return InvalidAgentResponseError(message="an answer's error is not an object")
    code, message = err.get("code"), str(err.get("message", ""))[:1000]
    data: dict[str, Any] | None = None
    for item in err.get("data") or ():
        if isinstance(item, dict) and item.get("@type") == _ERROR_INFO:
            data = item.get("metadata") or None
            break
    cls = _CODE_TO_ERROR.get(code) if isinstance(code, int) and not isinstance(code, bool) else None
    if cls is None:
        return A2AClientError(f"A2A error {code}: {message}")
    return cls(message or None, data=data)


def error_name(code: Any) -> str:
    """The A2A error class name of a JSON-RPC error code (``error CODE`` for an unknown one)."""
    cls = _CODE_TO_ERROR.get(code) if isinstance(code, int) and not isinstance(code, bool) else None
    return cls.__name__ if cls is not None else f"error {code}"


def parse_answer(payload: Any, into: ProtoMessage | None) -> ProtoMessage | None:
    """Decode an answer part into ``into`` (a fresh message of the method's result type; None for
    a method without a result). Raises the A2A error the part carries, or
    ``InvalidAgentResponseError`` for a part that is neither a result nor an error."""
    error = answer_error(payload)
    if error is not None:
        raise error
    if not isinstance(payload, dict) or "result" not in payload:
        raise InvalidAgentResponseError(message="an answer part is neither a result nor an error")
    if into is None:
        return None
    result = payload["result"]
    if not isinstance(result, dict):
        raise InvalidAgentResponseError(message=f"the result is not a {type(into).__name__} object")
    try:
        return ParseDict(result, into, ignore_unknown_fields=True)
    except Exception as exc:
        raise InvalidAgentResponseError(message=f"the result is not a {type(into).__name__}: {exc}") from None


# --- interfaces -------------------------------------------------------------------------------


def interface_url(agent_id: str, addresses: Sequence[str]) -> str:
    """``iac://AGENT_ID?addr=URL&addr=URL`` (addresses in the order they are to be tried)."""
    try:
        endpoint = Endpoint(check_agent_id(agent_id), tuple(addresses))
    except IacError as exc:
        raise ConfigError(f"an iac:// URL names an AgentId: {exc}") from None
    _check_addresses(endpoint.addresses)
    query = "&".join("addr=" + quote(a, safe=":/[]@") for a in endpoint.addresses)
    return f"{_SCHEME}://{agent_id}" + (f"?{query}" if query else "")


def parse_interface_url(url: str) -> Endpoint:
    """The AgentId and addresses of an ``iac://`` URL; :class:`ConfigError` for anything else."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigError(f"not an iac:// interface URL: {exc}") from None
    if parts.scheme != _SCHEME or parts.path not in ("", "/") or parts.fragment:
        raise ConfigError(f"not an iac:// interface URL: {url[:120]!r}")
    try:
        agent_id = check_agent_id(parts.netloc)
    except IacError as exc:
        raise ConfigError(f"the iac:// URL names no AgentId: {exc}") from None
    if any(key != "addr" for key, _ in query):
        raise ConfigError("an iac:// URL takes only addr=URL parameters")
    addresses = tuple(value for _, value in query)
    _check_addresses(addresses)
    return Endpoint(agent_id, addresses)


def _check_addresses(addresses: Sequence[str]) -> None:
    if len(addresses) > MAX_ADDRESSES:
        raise ConfigError(f"an iac:// URL lists at most {MAX_ADDRESSES} addresses")
    for a in addresses:
        parse_address(a)  # ConfigError for what is not quic://, tls:// or unix://


def iac_interface(agent_id: str, addresses: Sequence[str], *, version: str = VERSION) -> pb.AgentInterface:
    """The card entry of an IAC endpoint."""
    return pb.AgentInterface(
        protocol_binding=BINDING, protocol_version=version, url=interface_url(agent_id, addresses)
    )


def iac_endpoints(card: pb.AgentCard) -> list[Endpoint]:
    """The IAC endpoints a card lists (malformed ones are left out)."""
    out = []
    for i in card.supported_interfaces:
        if i.protocol_binding == BINDING:
            try:
                out.append(parse_interface_url(i.url))
            except ConfigError:
                continue
    return out


def with_iac_interface(card: pb.AgentCard, agent_id: str, addresses: Sequence[str]) -> pb.AgentCard:
    """A copy of ``card`` as ``agent_id`` serves it over IAC: its IAC interfaces are those naming
    ``agent_id`` (this endpoint first when it lists none); one naming another agent is dropped, so
    the card cannot send a client elsewhere."""
    out = pb.AgentCard()
    out.CopyFrom(card)
    kept, own = [], False
    for i in out.supported_interfaces:
        if i.protocol_binding != BINDING:
            kept.append(i)
            continue
        try:
            mine = parse_interface_url(i.url).agent_id == agent_id
        except ConfigError:
            mine = False
        if mine:
            kept.append(i)
            own = True
    if not own:
        kept.insert(0, iac_interface(agent_id, addresses))
    del out.supported_interfaces[:]
    out.supported_interfaces.extend(kept)
    return out


def check_principal(principal: str) -> str:
    """``principal`` if it may go in Message field 19: at most :data:`MAX_PRINCIPAL` bytes of
    UTF-8, no control characters; else :class:`ConfigError`."""
    if len(principal.encode("utf-8", "surrogatepass")) > MAX_PRINCIPAL:
        raise ConfigError(f"a principal is at most {MAX_PRINCIPAL} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in principal):
        raise ConfigError("a principal holds no control characters")
    return principal


__all__ = [
    "BINDING",
    "GET_AGENT_CARD",
    "MAX_PRINCIPAL",
    "METHODS",
    "MSG_TYPE",
    "PRINCIPAL_STATE",
    "VERSION",
    "VERSIONS",
    "Call",
    "Endpoint",
    "IacBindingError",
    "Method",
    "answer_error",
    "call_payload",
    "check_principal",
    "error_name",
    "error_payload",
    "iac_endpoints",
    "iac_interface",
    "interface_url",
    "parse_answer",
    "parse_call",
    "parse_interface_url",
    "result_payload",
    "supported_version",
    "with_iac_interface",
]
