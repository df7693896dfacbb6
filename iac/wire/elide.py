"""Elided ``from``/``to`` on direct connections (capability ``elide/1``).

Every MESSAGE a node sends to a peer on a direct connection starts with the same bytes:
fields 1 and 2 (``from``, ``to``) with their tags and lengths, 132 bytes for two
AgentIds. When both HELLOs announce :data:`ELIDE_CAPABILITY`, a sender MAY leave that
prefix out of a MESSAGE frame's body, and the receiver puts it back before anything
reads the message: a body that does not start with the tag of field 1 (``0x0a``) gets
:func:`~iac.wire.dicts.message_prefix` (peer, self) in front. The signed bytes are the
restored ones, so signatures stay end to end; FORWARD bodies are never elided, so relays
see both fields. Sans-IO and stateless.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from iac.wire.dicts import message_prefix

#: Announced in HELLO ``capabilities`` by a side that restores elided prefixes.
ELIDE_CAPABILITY = "elide/1"
#: The first byte of a serialized Message that carries ``from`` (field 1, length-delimited).
_FROM_TAG = 0x0A


def elides(local_capabilities: Iterable[str], peer_capabilities: Iterable[str]) -> bool:
    """Whether MESSAGE frames on a connection between these two HELLOs may be elided."""
    return ELIDE_CAPABILITY in local_capabilities and ELIDE_CAPABILITY in peer_capabilities


@lru_cache(maxsize=4096)
def pair_prefix(sender: str, receiver: str) -> bytes:
    """:func:`message_prefix` of the pair, cached (a node talks to the same peers again)."""
    return message_prefix(sender, receiver)


def elide(body: bytes, prefix: bytes) -> bytes:
    """``body`` without ``prefix`` when it starts with it (and something follows), else ``body``."""
    if prefix and len(body) > len(prefix) and body.startswith(prefix):
        return body[len(prefix) :]
    return body


def restore(body: bytes, prefix: bytes) -> bytes:
    """A received MESSAGE body with its prefix back: ``prefix + body`` unless ``body`` carries ``from``."""
    if body and body[0] == _FROM_TAG:
        return body
    return prefix + body


__all__ = ["ELIDE_CAPABILITY", "elide", "elides", "pair_prefix", "restore"]
