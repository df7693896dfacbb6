"""Elided ``from``/``to`` on direct connections (capability ``elide/1``).

Every MESSAGE a node sends to a peer on a direct connection starts with the same bytes:
fields 1 and 2 (``from``, ``to``) with their tags and lengths, 132 bytes for two
AgentIds. When both HELLOs announce :data:`ELIDE_CAPABILITY`, a sender MAY leave that
prefix out of a MESSAGE frame's body, and the receiver puts it back before anything
reads the message: a body that starts with the tag of field 3 (``0x18``, ``msg_type``)
gets :func:`~iac.wire.dicts.message_prefix` (peer, self) in front. The signed bytes are the
restored ones, so signatures stay end to end; FORWARD bodies are never elided, so relays
see both fields. Sans-IO and stateless.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from iac.wire.dicts import message_prefix

#: Announced in HELLO ``capabilities`` by a side that restores elided prefixes.
ELIDE_CAPABILITY = "elide/1"
#: The first byte of an elided body: the tag of field 3 (``msg_type``, a varint), which follows
#: ``from``/``to`` in every serialized Message that has a type. Other bodies are never touched.
_TYPE_TAG = 0x18
#: Only bodies up to this size (as they cross, elided) are elided and restored: 132 bytes
#: matter in small frames, and restoring copies the body, which must stay cheap.
MAX_ELIDED_BODY = 16 * 1024


def elides(local_capabilities: Iterable[str], peer_capabilities: Iterable[str]) -> bool:
    """Whether MESSAGE frames on a connection between these two HELLOs may be elided."""
    return ELIDE_CAPABILITY in local_capabilities and ELIDE_CAPABILITY in peer_capabilities


@lru_cache(maxsize=4096)
def pair_prefix(sender: str, receiver: str) -> bytes:
    """:func:`message_prefix` of the pair, cached (a node talks to the same peers again)."""
    return message_prefix(sender, receiver)


def elide(body: bytes, prefix: bytes) -> bytes:
    """``body`` without ``prefix`` when it starts with it followed by field 3 (``msg_type``)
    and what is left is at most :data:`MAX_ELIDED_BODY` bytes; else ``body``."""
    n = len(prefix)
    if prefix and n < len(body) <= MAX_ELIDED_BODY + n and body[n] == _TYPE_TAG and body.startswith(prefix):
        return body[n:]
    return body


def restore(body: bytes, prefix: bytes) -> bytes:
    """A received MESSAGE body with its prefix back: ``prefix + body`` when ``body`` starts with
    field 3 (``msg_type``) and is at most :data:`MAX_ELIDED_BODY` bytes; else ``body`` as it is
    (a whole Message starts with field 1; bodies that are not Messages stay untouched too)."""
    if body and body[0] == _TYPE_TAG and len(body) <= MAX_ELIDED_BODY:
        return prefix + body
    return body


__all__ = ["ELIDE_CAPABILITY", "MAX_ELIDED_BODY", "elide", "elides", "pair_prefix", "restore"]
