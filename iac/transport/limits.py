"""Handshake limits, sans-IO: a token bucket per source address, and when to send QUIC Retry.

A node with an open admission policy admits every key, so a flood of HELLOs
signed by fresh keys would cost one signature check each and fill the HELLO
nonce cache. Every listener therefore asks a :class:`HandshakeLimiter` before a
new connection's handshake starts (QUIC: before the TLS handshake too; TLS/TCP:
before the TLS handshake; UNIX: before the server's HELLO): each source (an IP
address, or a UNIX peer uid) has a token bucket of ``burst`` tokens refilled at
``rate`` per second, and the table of sources is bounded (the least recently
seen source is forgotten first, which only gives it a full bucket again).

A QUIC source address can be spoofed, so a flood could drain the bucket of an
honest address; QUIC's Retry (address validation) stops that. :class:`RetryGate`
decides when a QUIC listener sends Retry: always, never, or ("auto") while new
connections arrive faster than a threshold and for ``hold`` seconds after.

Nothing here reads a clock: every call takes ``now`` (seconds, any monotonic origin).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

from iac.errors import ConfigError, HandshakeError
from iac.transport.base import RETRY_MODES, TransportConfig

#: How long "auto" keeps sending Retry after the rate of new connections fell below the threshold.
RETRY_HOLD_S = 5.0


def is_local(source: str) -> bool:
    """A loopback IP address, or a UNIX-socket peer (``uid:…``)."""
    if source.startswith("uid:"):
        return True
    try:
        return ipaddress.ip_address(source.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def busy_error(source: str) -> HandshakeError:
    """The refusal of a source over its limit (``handshake_failed``, reason ``busy: …``)."""
    return HandshakeError(f"busy: too many new connections from {source}; try again later")


@dataclass
class _Bucket:
    tokens: float
    at: float
    refused: int = 0  # refusals since the source was last allowed (a log line goes for the first)


class HandshakeLimiter:
    """A token bucket per source, in a bounded table.

    ``rate`` None disables the limit (every call allows). ``limit_local`` False lets
    loopback addresses and UNIX-socket peers through without counting them.
    """

    def __init__(
        self,
        rate: float | None,
        burst: int,
        max_sources: int,
        *,
        limit_local: bool = False,
    ) -> None:
        if rate is not None and (rate <= 0 or burst < 1):
            raise ConfigError("a handshake limit needs a positive rate and a burst of at least 1")
        if max_sources < 1:
            raise ConfigError("max_sources must be at least 1")
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self.limit_local = limit_local
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def allow(self, source: str, now: float) -> bool:
        """Take a token for one new connection from ``source``; False when it has none."""
        if self.rate is None or (not self.limit_local and is_local(source)):
            return True
        buckets = self._buckets
        b = buckets.get(source)
        if b is None:
            b = buckets[source] = _Bucket(float(self.burst), now)
            while len(buckets) > self.max_sources:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(source)
            b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
            b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            b.refused = 0
            return True
        b.refused += 1
        return False

    def first_refusal(self, source: str) -> bool:
        """Whether the last refusal of ``source`` was its first since it was last allowed
        (log one line per burst of refusals, not one per packet)."""
        b = self._buckets.get(source)
        return b is not None and b.refused == 1

    def __len__(self) -> int:
        return len(self._buckets)

    @classmethod
    def from_config(cls, config: TransportConfig) -> HandshakeLimiter:
        """The limiter a listener uses, from its config."""
        return cls(
            config.handshake_rate,
            config.handshake_burst,
            config.handshake_sources,
            limit_local=config.handshake_limit_local,
        )


class RetryGate:
    """When a QUIC listener answers a new connection with Retry.

    ``mode``: "always", "never", or "auto": on while more than ``threshold`` new
    connections arrived in the last second (counted in two one-second windows), and
    for ``hold`` seconds after the last second above it.
    """

    def __init__(self, mode: str, threshold: float, hold: float = RETRY_HOLD_S) -> None:
        if mode not in RETRY_MODES:
            raise ConfigError(f"retry mode must be auto, always or never, not {mode!r}")
        self.mode = mode
        self.threshold = threshold
        self.hold = hold
        self._window = -1
        self._count = 0
        self._previous = 0
        self._until = float("-inf")
        #: Seconds in which "auto" turned Retry on (for stats and tests).
        self.activations = 0

    def observe(self, now: float) -> None:
        """One new connection attempt (an Initial for no known connection) arrived."""
        window = int(now)
        if window != self._window:
            self._previous = self._count if window == self._window + 1 else 0
            self._window = window
            self._count = 0
        self._count += 1
        # the rate over the last second: this window plus the part of the previous one still in it
        rate = self._count + self._previous * (1.0 - (now - window))
        if rate > self.threshold:
            if now >= self._until:
                self.activations += 1
            self._until = now + self.hold

    def active(self, now: float) -> bool:
        if self.mode == "always":
            return True
        if self.mode == "never":
            return False
        return now < self._until


__all__ = ["RETRY_HOLD_S", "HandshakeLimiter", "RetryGate", "busy_error", "is_local"]
