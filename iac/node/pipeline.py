"""The receive pipeline, sans-IO: a received message in, a decision out.

In the order of docs/PROTOCOL.md ("The receive pipeline"), each step cheaper than the next::

    open (field-8 scan, parse, `from` valid, signature) → the HELLO peer sent it →
    freshness and replay → addressed to me → topology policy → unseal and inner-header check →
    schema (type, JSON, task envelope, deadline, call shape) → content guards

then the node acts on the decision: :class:`Refuse` (count it; answer ERROR when ``answer``),
:class:`Duplicate` (re-answer or drop), :class:`Response` (a REPLY, ERROR or ACK for what this node
asked), :class:`Deliver` (reorder, then a handler). Nothing here does I/O or reads a clock: time is
an argument, and the replay store is called synchronously (the node decides on which thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iac.errors import (
    IacError,
    LocalError,
    MessageRejected,
    ProtocolError,
    Refusal,
    StoreUnavailable,
)
from iac.node.config import NodeConfig
from iac.node.store import Check, StoreRunner
from iac.node.types import Key
from iac.protocol.guards import (
    RESPONSE_TYPES,
    check_call,
    check_deadline,
    check_principal,
    check_task,
    check_type,
    decode_payload,
    run_guards,
)
from iac.protocol.replay import Verdict
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ACK_REQUESTED, open_message, sender_of
from iac.wire.seal import open_sealed

_COMMAND = int(MessageType.COMMAND)


@dataclass(slots=True)
class Item:
    """A message that passed every check: what reorder and the handlers get."""

    conn: Connection
    msg: Message
    payload: Any
    key: Key
    sealed: bool
    #: arrived inside FORWARD with an empty ``to``: delivered, never answered
    broadcast: bool = False
    #: its replay-store reservation was committed or released
    committed: bool = False
    #: it holds a handler slot
    slot: bool = False
    #: stream parts sent so far (a STREAM request)
    parts: int = 0


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refused: count ``reason``; answer ERROR ``reason.code`` when ``answer``. ``skip_ordered``:
    the id was consumed (an ORDERED message's refusal still advances its reorder buffer)."""

    reason: Refusal
    detail: str
    answer: bool
    skip_ordered: bool = False


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A copy of a message already seen: ``TOO_OLD`` (behind the window), ``IN_PROGRESS`` (its
    first copy is being handled) or ``DONE`` (handled: answer again)."""

    verdict: Verdict
    answer: bool


@dataclass(frozen=True, slots=True)
class Response:
    """A REPLY, ERROR or ACK addressed to this node; ``key`` names the message it answers."""

    msg: Message
    payload: Any
    key: Key


@dataclass(frozen=True, slots=True)
class Deliver:
    item: Item


Decision = Refuse | Duplicate | Response | Deliver


class ReceivePipeline:
    """The checks between a received message and a handler, for one node.

    The replay step is split in two so that a store that blocks can run off the loop:
    :meth:`replay_check` (freshness, then which store check to make) and :meth:`judge` (the
    store's verdict, then every later step)."""

    def __init__(self, identity: Identity, config: NodeConfig) -> None:
        self.identity = identity
        self.agent_id = identity.agent_id
        self.config = config
        self._store: StoreRunner | None = None

    def start(self, store: StoreRunner) -> None:
        self._store = store

    @property
    def store(self) -> StoreRunner:
        if self._store is None:
            raise LocalError("the node is not started")
        return self._store

    @staticmethod
    def open(body: bytes, peer: str) -> Message:
        """A MESSAGE frame's body: the field-8 scan, parse, ``from`` and signature (raise
        :class:`~iac.errors.MessageRejected` for a well-formed message that fails them, another
        :class:`~iac.errors.ProtocolError` for a malformed one); then the sender must be the peer
        whose HELLO proved this connection (``impersonation``: other origins travel
        inside FORWARD)."""
        msg = open_message(body)
        sender = sender_of(msg)
        if sender != peer:
            raise ProtocolError(
                f"MESSAGE from {sender[:16]}… on a connection whose HELLO proved "
                f"{peer[:16]}… (other origins travel inside FORWARD)",
                reason="impersonation",
            )
        return msg

    def replay_check(
        self, msg: Message, now: int, *, forwarded: bool = False, via: str | None = None
    ) -> Check | Refuse:
        """Freshness (no store needed), then the store check to make: single-phase for a response,
        a reservation for anything a handler takes."""
        is_response = msg.msg_type in RESPONSE_TYPES
        answer = not is_response and not (forwarded and not msg.to)
        guard = self.store.guard
        try:
            guard.check_fresh(msg.timestamp, now)
        except MessageRejected as exc:
            retried = bool(msg.flags & FLAG_ACK_REQUESTED)
            if abs(now - msg.timestamp) > guard.store.max_skew_us:
                # An ACK_REQUESTED message is not answered: its sender retransmits, each copy
                # stamped afresh, and the first one after its clock is right gets through (an
                # ORDERED session needs every id; an ERROR would end the message for good).
                return Refuse(Refusal.STALE, f"stale: {exc}", answer and not retried)
            # Fresh, but before the store's history (it forgot everything when it started): not
            # the sender's fault. A retransmission (a fresh timestamp) gets through; a plain
            # request gets busy at once, like a store that cannot answer.
            return Refuse(Refusal.BEFORE_HISTORY, str(exc), answer and bool(msg.deadline) and not retried)
        return Check((sender_of(msg), msg.session_id, msg.msg_id), is_response, via)

    def judge(
        self,
        conn: Connection,
        msg: Message,
        now: int,
        verdict: Verdict | IacError,
        *,
        forwarded: bool = False,
    ) -> Decision:
        """Every step after the replay store's ``verdict`` on this message."""
        sender = sender_of(msg)
        broadcast = forwarded and not msg.to
        is_response = msg.msg_type in RESPONSE_TYPES
        answer = not broadcast and not is_response
        if isinstance(verdict, IacError):
            if is_response and isinstance(verdict, StoreUnavailable):
                return self._response(msg, sender)  # unmarked: the pending table takes one answer only
            if verdict.reason == Refusal.REPLAY_STORE_FULL:
                return Refuse(Refusal.REPLAY_STORE_FULL, str(verdict), answer)
            # A plain request gets ``busy`` now; an ACK_REQUESTED message is retransmitted by its sender.
            retried = bool(msg.flags & FLAG_ACK_REQUESTED)
            return Refuse(
                Refusal.STORE_UNAVAILABLE, str(verdict), answer and bool(msg.deadline) and not retried
            )
        if verdict is not Verdict.NEW:
            return Duplicate(verdict, answer)
        if is_response:
            return self._response(msg, sender)
        key: Key = (sender, msg.session_id, msg.msg_id)
        try:
            refusal = self._check(msg, sender, broadcast)
            payload: Any = None
            sealed = bool(msg.sealed)
            if refusal is None and sealed:
                msg, refusal = self._unseal(msg)
            if refusal is None:
                payload, refusal = decode_payload(msg.payload_json)
            if refusal is None:
                refusal = self._check_late(msg, sender, payload, now)
        except BaseException:
            self.store.release(key, now)
            raise
        if refusal is not None:
            self.store.commit(key, now)
            return Refuse(refusal[0], refusal[1], not broadcast, skip_ordered=True)
        return Deliver(Item(conn, msg, payload, key, sealed, broadcast))

    def commit(self, item: Item, now: int) -> None:
        """A delivered message was handled (or refused after delivery): its id is done."""
        if not item.committed:
            item.committed = True
            self.store.commit(item.key, now)

    def release(self, item: Item, now: int) -> None:
        """A delivered message was not handled (busy, closing): a retransmission may try again.
        Nothing once committed."""
        if not item.committed:
            item.committed = True
            self.store.release(item.key, now)

    # --- the steps --------------------------------------------------------------------------------

    def _check(self, msg: Message, sender: str, broadcast: bool) -> tuple[Refusal, str] | None:
        # addressed to me (or a broadcast that came inside FORWARD; relays take FORWARD frames only)
        if msg.to != self.agent_id and not broadcast:
            return (
                Refusal.NOT_ADDRESSED,
                "addressed to another agent (or broadcast) in a MESSAGE frame: relays take FORWARD",
            )
        if broadcast and msg.sealed:
            return Refusal.UNSEAL_FAILED, "a broadcast cannot be sealed"
        topo = self.config.topology
        if topo is not None and not topo.allows(sender, self.agent_id):
            return Refusal.POLICY_DENIED, "topology policy does not allow this sender to reach this node"
        return None

    def _unseal(self, msg: Message) -> tuple[Message, tuple[Refusal, str] | None]:
        """Open a sealed payload and check its inner header; the opened copy carries the clear
        ``payload_json`` and ``extra_data`` (``sealed`` emptied)."""
        try:
            text, extra = open_sealed(self.identity, msg)
        except IacError as exc:
            refusal = Refusal.SEALED_HEADER if exc.reason == Refusal.SEALED_HEADER else Refusal.UNSEAL_FAILED
            return msg, (refusal, str(exc))
        clear = Message()
        clear.CopyFrom(msg)
        clear.sealed = b""
        clear.payload_json = text
        clear.extra_data = extra
        return clear, None

    def _check_late(self, msg: Message, sender: str, payload: Any, now: int) -> tuple[Refusal, str] | None:
        c = self.config
        r = (
            check_type(msg, c.allowed_types)
            or check_task(msg, c.delegators, sender)
            or check_deadline(msg, now)
            or check_principal(msg)
        )
        if r is None and msg.msg_type == _COMMAND:
            r = check_call(payload)
        if r is None and c.guards:
            r = run_guards(c.guards, msg, payload)
        return r

    def _response(self, msg: Message, sender: str) -> Decision:
        if msg.to != self.agent_id:
            return Refuse(Refusal.NOT_ADDRESSED, "a response addressed to another agent", False)
        if msg.sealed:
            msg, r = self._unseal(msg)
            if r is not None:
                return Refuse(r[0], r[1], False)
        payload, r = decode_payload(msg.payload_json)
        if r is not None:
            return Refuse(r[0], r[1], False)
        return Response(msg, payload, (sender, msg.reply_session_id, msg.reply_to))


__all__ = ["Decision", "Deliver", "Duplicate", "Item", "ReceivePipeline", "Refuse", "Response"]
