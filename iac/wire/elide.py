"""Elided ``from``/``to`` on direct connections (capability ``elide/1``).

Every MESSAGE a node sends to a peer on a direct connection starts with the same bytes:
fields 1 and 2 (``from``, ``to``) with their tags and lengths, 132 bytes for two
AgentIds. When both HELLOs announce :data:`ELIDE_CAPABILITY`, a sender MAY leave that
prefix out of a MESSAGE frame's body, and the receiver puts it back before anything
reads the message: a body that starts with the tag of field 3 (``0x18``, ``msg_type``)
gets :func:`~iac.wire.dicts.message_prefix` (peer, self) in front. The signed bytes are the
restored ones, so signatures stay end to end.

FORWARD frames have their own capability, :data:`FORWARD_CAPABILITY` (``elide-forward/1``):
between two peers that both announce it, a Forward whose ``path`` starts with the inner
message's ``from`` and ends with the sender goes *compact* (:func:`compact_forward`): the
origin's AgentId once, as 32 raw bytes in field 4 (or 5) written first, the inner message
without its ``from`` (and, field 5, without its ``to`` when that is the receiver), the path
without its two ends. The receiver puts all of it back (:func:`restore_forward`) before any
check, so the inner bytes are the origin's, byte for byte. Sans-IO and stateless.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from google.protobuf.message import DecodeError

from iac.errors import ProtocolError
from iac.wire._pb.iac_pb2 import Forward
from iac.wire.dicts import message_prefix
from iac.wire.scan import FORWARD_SCHEMA, validate

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


#: Announced in HELLO ``capabilities`` by a side that restores compact Forwards.
FORWARD_CAPABILITY = "elide-forward/1"
#: What a compact FORWARD body starts with: the tag of field 4 (``origin``: ``from`` left out) or
#: field 5 (``origin_to_receiver``: ``from`` and ``to`` left out), then the length 32.
_ORIGIN_TAG, _ORIGIN_TO_RECEIVER_TAG, _KEY_SIZE = 0x22, 0x2A, 32
#: ``0x0a 0x40``: the tag and length of field 1 (``from``) of a Message, and of field 2 (``to``).
_FROM_HEAD, _TO_HEAD = b"\x0a\x40", b"\x12\x40"


def forwards_elided(local_capabilities: Iterable[str], peer_capabilities: Iterable[str]) -> bool:
    """Whether FORWARD frames on a connection between these two HELLOs may go compact."""
    return FORWARD_CAPABILITY in local_capabilities and FORWARD_CAPABILITY in peer_capabilities


def compact_forward(data: bytes, sender: str, receiver: str) -> bytes:
    """Whole Forward bytes ``data`` that ``sender`` sends to ``receiver``, compact when they can
    be (else ``data``): at most :data:`MAX_ELIDED_BODY` bytes, a path without repeats that
    ends with ``sender`` and starts with the inner message's ``from`` (its first field, as a
    canonical serializer writes it), so that :func:`restore_forward` gives ``data`` back."""
    if (
        len(data) > MAX_ELIDED_BODY
        or not data
        or data[0] == _ORIGIN_TAG
        or data[0] == _ORIGIN_TO_RECEIVER_TAG
    ):
        return data
    try:
        fwd = Forward.FromString(data)
    except DecodeError:
        return data
    path, message = fwd.path, fwd.message
    if not path or path[-1] != sender or len(set(path)) != len(path) or fwd.origin or fwd.origin_to_receiver:
        return data
    origin = path[0]
    if len(origin) != 64 or message[:2] != _FROM_HEAD or message[2:66] != origin.encode():
        return data
    try:
        key = bytes.fromhex(origin)
    except ValueError:
        return data
    if key.hex() != origin:  # not lowercase hex: restoring would not give the same bytes
        return data
    rest, tag = message[66:], _ORIGIN_TAG
    if rest[:2] == _TO_HEAD and rest[2:66] == receiver.encode():
        rest, tag = rest[66:], _ORIGIN_TO_RECEIVER_TAG
    middle = Forward(hop_limit=fwd.hop_limit, path=path[1:-1], message=rest)
    body = bytes((tag, _KEY_SIZE)) + key + middle.SerializeToString(deterministic=True)
    # Only what restores to the very bytes sent goes compact (e.g. no unknown fields reordered).
    return body if restore_forward(body, sender, receiver) == data else data


def restore_forward(body: bytes, sender: str, receiver: str) -> bytes:
    """A received FORWARD body as a whole Forward: a compact one (it starts with field 4 or 5,
    the origin's 32 raw bytes, and is at most :data:`MAX_ELIDED_BODY` bytes) gets the origin
    back in front of ``path`` and as the inner ``from``, ``receiver`` as the inner ``to`` (field
    5), and ``sender`` (the neighbour its HELLO proved) at the end of ``path`` unless the path
    is then just ``[sender]`` (the origin sent it). Any other body, and a compact one that does
    not scan, parse or name one origin of 32 bytes, is returned as it is: the Forward checks
    then refuse it as they refuse any malformed Forward."""
    if (
        len(body) < 2 + _KEY_SIZE
        or len(body) > MAX_ELIDED_BODY
        or body[1] != _KEY_SIZE
        or (body[0] != _ORIGIN_TAG and body[0] != _ORIGIN_TO_RECEIVER_TAG)
    ):
        return body
    try:
        validate(body, FORWARD_SCHEMA)  # a field twice is refused as in a whole Forward
        fwd = Forward.FromString(body)
    except (ProtocolError, DecodeError):
        return body
    key, other = (
        (fwd.origin, fwd.origin_to_receiver)
        if body[0] == _ORIGIN_TAG
        else (fwd.origin_to_receiver, fwd.origin)
    )
    if len(key) != _KEY_SIZE or other:
        return body
    origin = key.hex()
    head = _FROM_HEAD + origin.encode()
    if body[0] == _ORIGIN_TO_RECEIVER_TAG:
        head += _TO_HEAD + receiver.encode()
    path = [origin, *fwd.path]
    if path != [sender]:
        path.append(sender)
    whole = Forward(hop_limit=fwd.hop_limit, path=path, message=head + fwd.message)
    return whole.SerializeToString(deterministic=True)


__all__ = [
    "ELIDE_CAPABILITY",
    "FORWARD_CAPABILITY",
    "MAX_ELIDED_BODY",
    "compact_forward",
    "elide",
    "elides",
    "forwards_elided",
    "pair_prefix",
    "restore",
    "restore_forward",
]
