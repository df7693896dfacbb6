"""QUIC stateless reset (RFC 9000 section 10.3): tokens, packets and their bounds (no I/O).

A node that lost a connection's state (it crashed and started again on the same port) can
tell the peer at once that the connection is gone: it answers a packet for a connection ID
it does not know with a *stateless reset*, a datagram that looks like a short-header packet
and ends with the 16-byte reset token the node gave for that connection ID. The peer, which
kept the token, closes that connection at once instead of waiting for its probes or idle
timer to run out; whatever waited on it (a kept connection to a registry, a ``send-file``)
dials again.

The node must give the same token for a connection ID before and after a restart, so tokens
are derived from a secret that survives it, the node's Ed25519 seed, through HKDF-SHA256
(RFC 5869), keyed by the connection ID (docs/PROTOCOL.md, "Stateless reset")::

    PRK   = HKDF-Extract(salt = RESET_SALT, IKM = Ed25519 seed)
    token = HKDF-Expand(PRK, info = connection ID, L = 16)

Never from public values: whoever knows the connection ID (anyone on the path) must not be
able to compute the token.

Bounds: a reset is sent only in answer to a datagram of at least :data:`MIN_TRIGGER` bytes
and is always shorter than it (so two endpoints that both lost state cannot keep answering
each other: each answer is smaller, down to the size below which none is sent), at most
:data:`RESET_RATE` per second per socket (burst :data:`RESET_BURST`); datagrams for unknown
connection IDs are looked at, at most :data:`CHECK_RATE` per second per socket, the rest are
dropped uncounted by the library as before. A received datagram is a reset only when it
cannot be a packet of the connection (its connection ID is not one of the connection's) and
its last 16 bytes equal, compared in constant time, the token of a connection ID this side
used toward the address it came from.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: The size of a stateless reset token (RFC 9000).
TOKEN_SIZE = 16
#: HKDF-Extract's salt: names the use, so the seed's other uses never meet this one.
RESET_SALT = b"iac quic stateless reset v1"
#: The smallest stateless reset: 1 + 4 unpredictable bytes (38 unpredictable bits) + the token.
MIN_RESET = 5 + TOKEN_SIZE
#: The smallest datagram answered with a reset (the reset is one byte shorter).
MIN_TRIGGER = MIN_RESET + 1
#: The largest reset sent (a reset one byte shorter than a trigger of up to this many bytes + 1).
MAX_RESET = 43
#: Resets a socket sends per second, and its burst.
RESET_RATE = 20.0
RESET_BURST = 20
#: Datagrams for unknown connection IDs a socket looks at per second, and its burst.
CHECK_RATE = 100.0
CHECK_BURST = 50


def reset_key(seed: bytes) -> bytes:
    """HKDF-Extract of the node's Ed25519 ``seed``: the key every token of the node comes from."""
    return hmac.new(RESET_SALT, seed, hashlib.sha256).digest()


def reset_token(key: bytes, cid: bytes) -> bytes:
    """The reset token of connection ID ``cid``: HKDF-Expand(``key``, info=``cid``, L=16)."""
    return hmac.new(key, cid + b"\x01", hashlib.sha256).digest()[:TOKEN_SIZE]


class ResetTokens:
    """The tokens of one node, from its Ed25519 seed: ``tokens(cid)``."""

    __slots__ = ("_key",)

    def __init__(self, seed: bytes) -> None:
        self._key = reset_key(seed)

    def __call__(self, cid: bytes) -> bytes:
        return reset_token(self._key, cid)

    def __repr__(self) -> str:  # never the key
        return "ResetTokens(...)"


def build_reset(token: bytes, trigger_size: int, random: Callable[[int], bytes] = os.urandom) -> bytes | None:
    """The stateless reset answering a datagram of ``trigger_size`` bytes, or None when that
    datagram is too small to be answered (a reset is always shorter than its trigger). The
    first byte is a short header's (form bit 0, fixed bit 1), the rest unpredictable."""
    if trigger_size < MIN_TRIGGER:
        return None
    size = min(trigger_size - 1, MAX_RESET)
    body = random(size - TOKEN_SIZE)
    return bytes([0x40 | (body[0] & 0x3F)]) + body[1:] + token


def may_be_reset(data: bytes) -> bool:
    """Whether ``data`` has the shape of a stateless reset (a short header, long enough)."""
    return len(data) >= MIN_RESET and not data[0] & 0x80


def matches(data: bytes, tokens: Iterable[bytes]) -> bool:
    """Whether the last 16 bytes of ``data`` equal one of ``tokens`` (constant-time compare,
    every token compared: nothing about a token leaks through timing)."""
    tail = data[-TOKEN_SIZE:]
    found = False
    for token in tokens:
        if len(token) == TOKEN_SIZE and hmac.compare_digest(tail, token):
            found = True
    return found


class Bucket:
    """A token bucket: at most ``burst`` at once, refilled at ``rate`` per second (time is an
    argument, never read from a clock)."""

    __slots__ = ("_at", "_level", "burst", "rate")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._level = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        if self._at is not None:
            self._level = min(float(self.burst), self._level + (now - self._at) * self.rate)
        self._at = now
        if self._level < 1.0:
            return False
        self._level -= 1.0
        return True


@dataclass
class ResetStats:
    """What one socket did with datagrams for connection IDs it does not know."""

    #: Resets sent in answer to a packet for an unknown connection ID.
    sent: int = 0
    #: Resets received whose token matched: that connection closed at once.
    received: int = 0
    #: Datagrams shaped like a reset whose token matched no connection toward their sender
    #: (forged, stray or late): ignored.
    ignored: int = 0
    #: Datagrams for unknown connection IDs not answered: over the rate bounds, or too small.
    unanswered: int = 0


__all__ = [
    "CHECK_BURST",
    "CHECK_RATE",
    "MAX_RESET",
    "MIN_RESET",
    "MIN_TRIGGER",
    "RESET_BURST",
    "RESET_RATE",
    "RESET_SALT",
    "TOKEN_SIZE",
    "Bucket",
    "ResetStats",
    "ResetTokens",
    "build_reset",
    "matches",
    "may_be_reset",
    "reset_key",
    "reset_token",
]
