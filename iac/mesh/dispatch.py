"""The REGISTER_KEY handler of one node, shared by the mesh roles composed with it.

A node has one handler per message type, and several mesh roles read REGISTER_KEY: the
registry role (:class:`~iac.RegistryService`) answers requests, and each discovery client
(:class:`~iac.MeshClient`) takes note of the rotations and revocations its peers announce.
:meth:`RegisterKeyDispatcher.of` finds the dispatcher a node holds (it is the node's handler
itself, so the node keeps no mesh state anywhere else) or installs one; each role attaches on
creation and detaches when closed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from iac.errors import ConfigError, ErrorCode, HandlerError
from iac.mesh.wire import OP_PUBLISH, OP_REVOKE, OP_ROTATE, OPS
from iac.node.node import Context, Node
from iac.wire.enums import MessageType


class RegistryRole(Protocol):
    """What answers registry requests (:class:`~iac.RegistryService`)."""

    async def handle(self, sender: str, payload: dict[str, Any], *, via: str | None = None) -> Any: ...


class StatementListener(Protocol):
    """What takes note of announced rotations and revocations (:class:`~iac.MeshClient`)."""

    def note_statement(self, payload: dict[str, Any]) -> dict[str, Any]: ...


class TraversalRole(Protocol):
    """What answers the NAT traversal operations (:class:`~iac.mesh.nat.Traversal`)."""

    async def handle(self, sender: str, payload: dict[str, Any]) -> Any: ...

    def candidates(self) -> list[tuple[str, str]]: ...

    def note_observed(self, observer: str, url: str) -> bool: ...


#: NAT traversal operations (:mod:`iac.mesh.nat`), routed to the traversal role.
NAT_OPS = frozenset({"observe", "punch", "punch_sync"})


class RegisterKeyDispatcher:
    """The REGISTER_KEY handler of one node: the registry role (if any), then the clients.

    The node's registered handler is the bound coroutine method :meth:`handle` (the node runs a
    handler on its event loop when it is a coroutine function).
    """

    def __init__(self) -> None:
        self.registry: RegistryRole | None = None
        self.clients: list[StatementListener] = []
        self.traversal: TraversalRole | None = None

    @classmethod
    def of(cls, node: Node) -> RegisterKeyDispatcher:
        """The dispatcher ``node`` holds, installed as its REGISTER_KEY handler on first use.

        Raises :class:`ConfigError` when some other handler holds REGISTER_KEY.
        """
        current = node.handler(MessageType.REGISTER_KEY)
        if current is None:
            dispatcher = cls()
            node.on(MessageType.REGISTER_KEY)(dispatcher.handle)
            return dispatcher
        owner = getattr(current, "__self__", None)
        if isinstance(owner, RegisterKeyDispatcher) and current == owner.handle:
            return owner
        raise ConfigError(
            "another handler holds REGISTER_KEY on this node; the registry role and the mesh client "
            "need it (register no REGISTER_KEY handler on a node the mesh uses)"
        )

    def attach_registry(self, registry: RegistryRole) -> None:
        if self.registry is not None:
            raise ConfigError("this node already serves a registry")
        self.registry = registry

    def detach_registry(self, registry: RegistryRole) -> None:
        if self.registry is registry:
            self.registry = None

    def attach_traversal(self, role: TraversalRole) -> None:
        if self.traversal is not None:
            raise ConfigError("this node already has a NAT traversal role")
        self.traversal = role

    def detach_traversal(self, role: TraversalRole) -> None:
        if self.traversal is role:
            self.traversal = None

    def attach_client(self, client: StatementListener) -> None:
        if client not in self.clients:
            self.clients.append(client)

    def detach_client(self, client: StatementListener) -> None:
        if client in self.clients:
            self.clients.remove(client)

    async def handle(self, ctx: Context) -> Any:
        """Answer one REGISTER_KEY message (raises :class:`HandlerError`)."""
        payload = ctx.payload
        if isinstance(payload, dict) and payload.get("op") == "observe":
            # any mesh node says where it sees the asker from (its signed reply is the proof
            # of who said so, not that the address is honest)
            seen = observed_address(ctx.node, ctx.sender)
            if seen is None:
                raise HandlerError(ErrorCode.NO_HANDLER, "not connected directly: nothing observed")
            return {"op": "observe", "observed": seen}
        if isinstance(payload, dict) and payload.get("op") in NAT_OPS:
            if self.traversal is None:
                raise HandlerError(ErrorCode.NO_HANDLER, "this node does no NAT traversal")
            return await self.traversal.handle(ctx.sender, payload)
        if not isinstance(payload, dict) or payload.get("op") not in OPS:
            raise HandlerError(
                ErrorCode.BAD_REQUEST, f"bad_record: a registry message is {{op: {sorted(OPS)}}}"
            )
        op = payload["op"]
        result: Any = None
        if self.registry is not None:
            result = await self.registry.handle(ctx.sender, payload, via=ctx.via or None)
            if op == OP_PUBLISH and isinstance(result, dict):
                # where the publisher is seen from (its NAT's mapping), in the signed reply
                seen = observed_address(ctx.node, ctx.sender)
                if seen is not None:
                    result["observed"] = seen
        elif op not in (OP_ROTATE, OP_REVOKE) or not self.clients:
            raise HandlerError(ErrorCode.NO_HANDLER, "this node is not a registry")
        if op in (OP_ROTATE, OP_REVOKE):
            for client in list(self.clients):
                if self.registry is not None:  # the registry decided; a client's view is secondary
                    with contextlib.suppress(HandlerError):
                        client.note_statement(payload)
                    continue
                noted = client.note_statement(payload)
                if result is None:
                    result = noted
        return result


def observed_address(node: Any, peer: str) -> str | None:
    """The address ``node``'s direct connection to ``peer`` sees it at, if any."""
    conn = node.connection(peer) if node is not None else None
    url = conn.peer.address if conn is not None else ""
    return url if url.startswith(("quic://", "tls://")) else None


__all__ = [
    "NAT_OPS",
    "RegisterKeyDispatcher",
    "RegistryRole",
    "StatementListener",
    "TraversalRole",
    "observed_address",
]
