"""The principal a gateway forwards a call for (Message field 19).

A gateway authenticates its callers itself (a bearer token, an API key) and forwards each call
signed with its own key; field 19 names the caller it authenticated, so the agent sees both: the
gateway's AgentId (the signer, ``ctx.sender``) and the principal (``ctx.message.principal``). The
signature covers the field, so nobody between the gateway and the agent can change it -- but an
agent should believe it only from gateways it trusts (:func:`principal_of`).

The field is set on the messages a node builds toward one peer while a :func:`stamping` block
runs in the calling task (an :class:`~iac.node.Observer` sets it before the message is signed).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Collection, Iterator

from iac.errors import ErrorCode, HandlerError
from iac.integrations.a2a.binding import MAX_PRINCIPAL
from iac.node.node import Context, Node
from iac.node.observe import Observer
from iac.protocol.guards import RESPONSE_TYPES
from iac.wire._pb.iac_pb2 import Message

#: (peer, principal) of the call the current task makes, if any.
_CURRENT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "iac_a2a_principal", default=None
)
_STAMPED: weakref.WeakSet[Node] = weakref.WeakSet()


class _Stamp(Observer):
    """Sets field 19 on the messages toward the peer of the current :func:`stamping` block."""

    def outgoing(self, msg: Message) -> None:
        current = _CURRENT.get()
        if current is not None and msg.to == current[0] and msg.msg_type not in RESPONSE_TYPES:
            msg.principal = current[1]


def enable(node: Node) -> None:
    """Let :func:`stamping` set field 19 on what ``node`` sends (once per node)."""
    if node not in _STAMPED:
        node.observe(_Stamp())
        _STAMPED.add(node)


@contextlib.contextmanager
def stamping(peer: str, principal: str) -> Iterator[None]:
    """Within the block, messages the current task builds toward ``peer`` name ``principal``
    (a node that :func:`enable` saw). Keep the block to one step of the call: it must not span an
    ``await`` another task resumes, nor a ``yield``."""
    if not principal:
        yield
        return
    token = _CURRENT.set((peer, principal))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def principal_of(ctx: Context, gateways: Collection[str]) -> str:
    """The principal a handler may believe: field 19 when the signer is one of ``gateways``
    (AgentIds), "" when the message names none. A message from any other signer that names one is
    refused: :class:`~iac.HandlerError` ``unauthorized`` (the caller learns it is not trusted)."""
    principal = ctx.message.principal
    if not principal:
        return ""
    if ctx.sender not in gateways:
        raise HandlerError(ErrorCode.UNAUTHORIZED, "the sender is not a gateway this agent trusts")
    if len(principal.encode("utf-8")) > MAX_PRINCIPAL or any(ord(c) < 0x20 for c in principal):
        raise HandlerError(ErrorCode.BAD_REQUEST, "the principal is too long or holds control characters")
    return principal


__all__ = ["enable", "principal_of", "stamping"]
