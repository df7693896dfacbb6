"""The FORWARD frame: the origin's signed message inside hop-by-hop routing metadata.

A FORWARD frame carries ``iac.Forward``::

    message Forward { uint32 hop_limit = 1; repeated string path = 2; bytes message = 3; }

* ``message`` is the origin's signed ``Message`` bytes, *unchanged*: every
  receiver verifies the origin's signature over them (never a relay's), so a
  relay that alters one byte is caught. ``hop_limit`` and ``path`` are
  hop-by-hop metadata that the signature does not cover (like an IP TTL):
  a relay could lie in them, and the router's checks only use them to stop
  floods and loops early.
* ``hop_limit``: how many more links the Forward may cross, at least 1 when
  sent. The origin sets it (:data:`~iac.protocol.routing.router.DEFAULT_HOP_LIMIT` for unicast,
  :data:`~iac.protocol.routing.router.DEFAULT_BROADCAST_HOP_LIMIT` for broadcasts); a relay sends
  ``min(hop_limit - 1, policy.max_hop_limit)``, and does not send when that is 0
  or when the path is full (:data:`MAX_PATH` ids: there is no room for its own).
  A received Forward with ``hop_limit`` 0 is refused (``hop_limit_exhausted``).
* ``path``: the AgentIds that sent this Forward so far, origin first; each
  sender appends its own id before sending. A receiver checks that the path
  is at most :data:`MAX_PATH` well-formed ids without repeats, that it starts
  with the inner message's ``from`` and ends with the neighbour it came from
  (the peer the connection's HELLO proved), and refuses it as a loop when its
  own id is already in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from iac.errors import ConfigError, ProtocolError, RoutingError
from iac.wire._pb.iac_pb2 import Forward, Message
from iac.wire.identity import Domain, is_agent_id, verify
from iac.wire.message import sender_of
from iac.wire.scan import FORWARD_SCHEMA, MESSAGE_SCHEMA, excise_signature, validate

MAX_PATH = 64
U32 = (1 << 32) - 1


def require_agent_id(value: str, what: str) -> str:
    """An AgentId passed by the caller: a malformed one is a :class:`ConfigError` (local misuse)."""
    if not is_agent_id(value):
        raise ConfigError(f"{what} must be an AgentId (64 lowercase hex characters), got {value!r:.80}")
    return value


@dataclass(frozen=True, slots=True)
class ForwardEnvelope:
    """A parsed Forward: the hop-by-hop metadata and the origin's message bytes (not yet verified)."""

    hop_limit: int
    path: tuple[str, ...]
    message: bytes


def wrap_forward(message: bytes, hop_limit: int, path: Sequence[str]) -> bytes:
    """Forward bytes around the origin's signed ``message`` (kept byte for byte)."""
    if not 1 <= hop_limit <= U32:
        raise ConfigError(f"hop_limit must be in [1, 2**32 - 1], got {hop_limit}")
    if not 1 <= len(path) <= MAX_PATH:
        raise ConfigError(f"path holds 1 to {MAX_PATH} AgentIds, got {len(path)}")
    for hop in path:
        require_agent_id(hop, "every path entry")
    fwd = Forward(hop_limit=hop_limit, path=list(path), message=message)
    return fwd.SerializeToString(deterministic=True)


def parse_forward(data: bytes) -> ForwardEnvelope:
    """Parse Forward bytes without verifying the inner message.

    Raises ``malformed_message`` for bytes that are not one unambiguous
    Forward (a singular field twice, a wrong wire type, a compact Forward's origin: compact
    ones are restored on receipt, :func:`iac.wire.elide.restore_forward`) and
    ``bad_forward_path`` for a path that is too long or holds a malformed id.
    """
    validate(data, FORWARD_SCHEMA)
    try:
        fwd = Forward.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"Forward does not parse: {exc}", reason="malformed_message") from None
    if fwd.origin or fwd.origin_to_receiver:
        # a compact Forward (elide-forward/1) its receiver did not restore: not announced, or
        # not restorable (docs/PROTOCOL.md, "Compact Forwards")
        raise ProtocolError(
            "Forward carries an origin field: a compact Forward not restored", reason="malformed_message"
        )
    path = tuple(fwd.path)
    if len(path) > MAX_PATH:
        raise RoutingError(f"path holds {len(path)} ids, above {MAX_PATH}", reason="bad_forward_path")
    for hop in path:
        if not is_agent_id(hop):
            raise RoutingError(f"path holds a malformed AgentId {hop[:80]!r}", reason="bad_forward_path")
    return ForwardEnvelope(fwd.hop_limit, path, fwd.message)


def parse_inner_message(data: bytes) -> tuple[Message, bytes, bytes]:
    """The field-8 scan and the parse of the origin's message: ``(message, unsigned, signature)``."""
    unsigned, signature = excise_signature(data, MESSAGE_SCHEMA)
    try:
        msg = Message.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"Message does not parse: {exc}", reason="malformed_message") from None
    return msg, unsigned, signature


def open_forward(data: bytes) -> tuple[ForwardEnvelope, Message]:
    """Parse a Forward and verify the origin's message inside (as :func:`iac.wire.message.open_message`)."""
    env = parse_forward(data)
    msg, unsigned, signature = parse_inner_message(env.message)
    verify(sender_of(msg), Domain.MESSAGE, unsigned, signature)
    return env, msg
