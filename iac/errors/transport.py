"""Transport faults: the network (or a shared store) failed; nobody broke the protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from iac.errors.base import IacError


class TransportError(IacError):
    """The network failed: connect refused, reset, timeout, closed. Retry, or try elsewhere."""

    name = "transport_error"


class ConnectionClosed(TransportError):
    """The connection closed; ``code`` and ``peer_reason`` say why when the peer told us."""

    name = "connection_closed"

    def __init__(
        self, message: str, code: int | None = None, peer_reason: str = "", *, reason: str | None = None
    ) -> None:
        super().__init__(message, reason=reason)
        self.code = code
        self.peer_reason = peer_reason


class StoreUnavailable(TransportError):
    """A replay or record store cannot be used: Redis is unreachable or timed out, or the SQLite
    file fails.

    The message being checked is neither accepted nor refused; handle it as a
    transport failure (the sender retransmits).
    """

    name = "store_unavailable"


class DeliveryError(TransportError):
    """An ACK_REQUESTED message was not acknowledged before its delivery deadline."""

    name = "delivery_error"


class RequestTimeout(TransportError, TimeoutError):
    """No REPLY or ERROR came before the request's timeout (a CANCEL was sent)."""

    name = "request_timeout"


@dataclass(frozen=True)
class Attempt:
    """One dial attempt and how it ended."""

    url: str
    transport: str
    outcome: str  # "ok", or the error's reason ("timeout", "transport_error", "wrong_peer", ...)
    detail: str = ""
    elapsed: float = 0.0

    def __str__(self) -> str:
        return f"{self.url}: {self.outcome}" + (f" ({self.detail})" if self.detail else "")


class DialError(TransportError):
    """Every address of a peer failed; ``attempts`` says how each one did."""

    name = "dial_failed"

    def __init__(self, target: str, attempts: Sequence[Attempt], note: str = "") -> None:
        self.target = target
        self.attempts = list(attempts)
        parts = "; ".join(str(a) for a in attempts) or note or "no address to try"
        super().__init__(f"cannot reach {target}: {parts}".replace("\n", " "))
