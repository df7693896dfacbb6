"""ERROR answers: why a message was refused, and the two errors that carry an answer
(:class:`HandlerError` on the answering side, :class:`RemoteError` on the asking side)."""

from __future__ import annotations

from enum import StrEnum

from iac.errors.base import ERROR_CODES, ROWS, ErrorCode, IacError
from iac.errors.local import ConfigError


class Refusal(StrEnum):
    """Why the receive pipeline refused a message: the keys of ``NodeStats.refused``.

    In pipeline order. Each value is a reason of :data:`~iac.errors.REASONS`, spelled as errors,
    logs and metrics spell it. ``code`` is the ERROR code answered, or None where nothing is
    answered (replays, duplicates, refused ERROR/ACK/REPLY).
    """

    BAD_SIGNATURE = "bad_signature"
    STALE = "stale_message"
    REPLAYED = "replayed_message"  # older than the replay window
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
    SEALED_HEADER = "sealed_header_mismatch"
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
        return ROWS[self.value].error


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
    """The peer answered a request with an ERROR message (``code``, from the closed list)."""

    name = "remote_error"

    def __init__(self, code: str, message: str = "", *, reason: str | None = None) -> None:
        super().__init__(f"{code}: {message}" if message else code, reason=reason)
        self.code = code
        self.message = message


class TransferRefused(RemoteError):
    """The receiver answered with a ``failed`` ack; ``code`` is its error's reason."""

    name = "transfer_refused"
