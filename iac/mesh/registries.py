"""The registries a client talks to, and how it asks them.

A registry is named by its AgentId and addresses (:class:`RegistryAddr`, or ``AGENT_ID@URL``
strings through :func:`parse_registry`). :func:`ask_registries` sends one registry request to
them in order: a refusal is final, an unreachable registry moves on to the next.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from iac.errors import ConfigError, IacError, MessageRejected, RemoteError, TransportError
from iac.mesh.wire import raise_remote
from iac.node.node import Node
from iac.transport.base import parse_address
from iac.wire.enums import MessageType
from iac.wire.identity import check_agent_id, is_agent_id

log = logging.getLogger("iac.mesh")


@dataclass(frozen=True, slots=True)
class RegistryAddr:
    """A registry to talk to: its AgentId and addresses."""

    agent_id: str
    addresses: tuple[str, ...]

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id)
        if not self.addresses:
            raise ConfigError("a registry needs at least one address")
        for url in self.addresses:
            parse_address(url)


def parse_registry(specs: Iterable[str]) -> list[RegistryAddr]:
    """Registries from ``AGENT_ID@URL`` strings (one id may repeat with more addresses)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        aid, sep, url = spec.partition("@")
        if not sep or not is_agent_id(aid):
            raise ConfigError(
                f"{spec!r:.100}: a registry is AGENT_ID@URL (64 hex characters, '@', an address)"
            )
        parse_address(url)
        out.setdefault(aid, []).append(url)
    return [RegistryAddr(aid, tuple(urls)) for aid, urls in out.items()]


async def ask_registry(node: Node, reg: RegistryAddr, payload: dict[str, Any], *, timeout: float) -> Any:
    """One registry request to ``reg``: its answer, or the typed refusal it named."""
    try:
        reply = await node.request(reg.agent_id, MessageType.REGISTER_KEY, payload, timeout=timeout)
    except RemoteError as exc:
        raise_remote(exc)
    if not isinstance(reply.payload, dict) or reply.payload.get("op") != payload["op"]:
        raise MessageRejected("the registry's reply does not answer the request", reason="bad_record")
    return reply.payload


async def ask_registries(
    node: Node,
    registries: Sequence[RegistryAddr],
    payload: dict[str, Any],
    *,
    timeout: float,
    every: bool = False,
) -> Any:
    """Ask the registries in order: the first answer (``every``: ask all, need one success).

    A refusal (a :class:`~iac.MessageRejected`) is final; an unreachable registry moves on.
    """
    if not registries:
        raise ConfigError("no registry configured")
    last: IacError | None = None
    first: Any = None
    ok = False
    for reg in registries:
        try:
            result = await ask_registry(node, reg, payload, timeout=timeout)
        except (TransportError, RemoteError) as exc:
            log.info("registry %s… unavailable: %s", reg.agent_id[:16], exc)
            last = exc
            continue
        if not ok:
            first, ok = result, True
        if not every:
            return result
    if not ok:
        assert last is not None
        raise last
    return first


__all__ = ["RegistryAddr", "ask_registries", "ask_registry", "parse_registry"]
