"""ERROR answers: the closed list of codes, why a message was refused, and the two errors
that carry an answer (:class:`HandlerError` on the answering side, :class:`RemoteError` on the
asking side)."""

from __future__ import annotations

from enum import StrEnum

from iac.errors.base import IacError
from iac.errors.local import ConfigError


class ErrorCode(StrEnum):
    """The closed list of ERROR codes (``{"code": ..., "message": ...}`` in ``payload_json``)."""

    NO_HANDLER = "no_handler"  # no handler for this msg_type, or the remote call name is not exposed
    TIMEOUT = "timeout"  # the request's deadline passed before it was started, or while it ran
    UNAUTHORIZED = "unauthorized"  # the sender may not do this (delegation allow-list, sealed header)
    BAD_SIGNATURE = "bad_signature"  # the signature (or the `from` AgentId) did not verify
    POLICY_DENIED = (
        "policy_denied"  # topology policy; a MESSAGE frame addressed elsewhere (relays take FORWARD)
    )
    CONTENT_BLOCKED = "content_blocked"  # a content guard refused the payload
    BAD_REQUEST = "bad_request"  # schema: type, JSON, task envelope, call shape, stale timestamp
    BUSY = "busy"  # a bound is hit (handler backlog, per-peer quota, replay store, draining)
    CANCELLED = "cancelled"  # the caller sent CANCEL
    INTERNAL = "internal"  # the handler raised something else


#: The closed list of ERROR codes as strings (the values of :class:`ErrorCode`).
ERROR_CODES: frozenset[str] = frozenset(c.value for c in ErrorCode)


class Refusal(StrEnum):
    """Why the receive pipeline refused a message: the keys of ``NodeStats.refused``.

    In pipeline order. ``code`` is the ERROR code answered, or None where
    nothing is answered (replays, duplicates, refused ERROR/ACK/REPLY).
    """

    BAD_SIGNATURE = "bad_signature"
    STALE = "stale"
    REPLAYED = "replayed"  # older than the replay window
    DUPLICATE = "duplicate"  # already handled (re-answered) or being handled
    REPLAY_STORE_FULL = "replay_store_full"
    #: the replay store failed; a plain request is answered ``busy`` (retry), an ACK_REQUESTED
    #: message is not answered (its sender retransmits), a response is delivered unmarked
    STORE_UNAVAILABLE = "store_unavailable"
    #: fresh, but older than the replay store's history (a store that forgot everything started
    #: after it was sent): answered like store_unavailable, so that a retransmission gets through
    BEFORE_HISTORY = "before_history"
    NOT_ADDRESSED = "not_addressed"
    #: a unicast FORWARD that crossed no relay (origin = neighbour, ``to`` = this node): such a
    #: message travels in a MESSAGE frame, where the impersonation check applies
    FORWARD_NOT_RELAYED = "forward_not_relayed"
    POLICY_DENIED = "policy_denied"
    UNSEAL_FAILED = "unseal_failed"
    SEALED_HEADER = "sealed_header"
    BAD_TYPE = "bad_type"
    BAD_PAYLOAD = "bad_payload"
    BAD_TASK = "bad_task"
    DELEGATION_DENIED = "delegation_denied"
    DEADLINE_PASSED = "deadline_passed"
    CONTENT_BLOCKED = "content_blocked"
    NO_HANDLER = "no_handler"
    BAD_CALL = "bad_call"
    BUSY = "busy"
    #: a FILE_TRANSFER chunk or query refused by the receiver (details in ``NodeStats.file_refused``)
    FILE_TRANSFER = "file_transfer"
    UNMATCHED_RESPONSE = "unmatched_response"

    @property
    def code(self) -> ErrorCode | None:
        return _REFUSAL_CODES.get(self)


_REFUSAL_CODES: dict[Refusal, ErrorCode] = {
    Refusal.BAD_SIGNATURE: ErrorCode.BAD_SIGNATURE,
    Refusal.STALE: ErrorCode.BAD_REQUEST,
    Refusal.REPLAY_STORE_FULL: ErrorCode.BUSY,
    Refusal.STORE_UNAVAILABLE: ErrorCode.BUSY,
    Refusal.BEFORE_HISTORY: ErrorCode.BUSY,
    Refusal.NOT_ADDRESSED: ErrorCode.POLICY_DENIED,
    Refusal.POLICY_DENIED: ErrorCode.POLICY_DENIED,
    Refusal.UNSEAL_FAILED: ErrorCode.BAD_REQUEST,
    Refusal.SEALED_HEADER: ErrorCode.UNAUTHORIZED,
    Refusal.BAD_TYPE: ErrorCode.BAD_REQUEST,
    Refusal.BAD_PAYLOAD: ErrorCode.BAD_REQUEST,
    Refusal.BAD_TASK: ErrorCode.BAD_REQUEST,
    Refusal.DELEGATION_DENIED: ErrorCode.UNAUTHORIZED,
    Refusal.DEADLINE_PASSED: ErrorCode.TIMEOUT,
    Refusal.CONTENT_BLOCKED: ErrorCode.CONTENT_BLOCKED,
    Refusal.NO_HANDLER: ErrorCode.NO_HANDLER,
    Refusal.BAD_CALL: ErrorCode.BAD_REQUEST,
    Refusal.BUSY: ErrorCode.BUSY,
    Refusal.FILE_TRANSFER: ErrorCode.BAD_REQUEST,
}


class HandlerError(IacError):
    """Raise in a handler to answer with a chosen ERROR code from the closed list.

    Any other exception a handler raises is answered with ``internal`` (its text
    is not sent: it may hold secrets).
    """

    name = "handler_error"

    def __init__(self, code: str | ErrorCode, message: str = "") -> None:
        code = code.value if isinstance(code, ErrorCode) else code
        if code not in ERROR_CODES:
            raise ConfigError(f"{code!r} is not an ERROR code; use one of {sorted(ERROR_CODES)}")
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class RemoteError(IacError):
    """The peer answered a request with an ERROR message."""

    name = "remote_error"

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class TransferRefused(RemoteError):
    """The receiver answered with a ``failed`` ack; ``code`` is its error name."""

    name = "transfer_refused"
