"""The receive pipeline: received messages in, one decision each out.

In the order of docs/PROTOCOL.md ("The receive pipeline"), each step cheaper than the next::

    open (field-8 scan, parse, `from` valid, signature) → the HELLO peer sent it →
    freshness and replay → addressed to me → topology policy → unseal and inner-header check →
    schema (type, JSON, task envelope, deadline, call shape) → content guards

The first two steps are :mod:`iac.node.verify`'s (they run on the crypto worker for a batch);
:meth:`ReceivePipeline.receive` takes the verified messages of a batch and makes every later step
in one call: each message's facts (a response? is an answer wanted? retried? a broadcast?) are
worked out once, the replay checks of the whole batch go to the store together, and each
decision names its route, so the node acts on it without asking again:
:class:`Refuse` (count it; answer ERROR when ``answer``), :class:`Duplicate` (re-answer or drop),
:class:`Response` (a REPLY, ERROR or ACK for what this node asked), or the delivered
:class:`~iac.node.types.Item` itself (to its ``route``: a handler, reorder, CANCEL, CREDIT or the
file receiver). The decisions are plain slotted dataclasses, read-only by convention (one is made
per message; see :class:`~iac.wire.frames.Frame`). Nothing here reads a clock
(time is an argument) or touches a socket; the replay store is its one collaborator, awaited
(:class:`~iac.node.store.StoreRunner` runs a store that blocks off the loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from iac.errors import (
    IacError,
    MessageRejected,
    Refusal,
    StoreUnavailable,
)
from iac.node.config import NodeConfig
from iac.node.store import CheckTuple, StoreRunner
from iac.node.types import WANTS_ACK, WANTS_NOTHING, WANTS_REPLY, Item, Key
from iac.protocol.guards import (
    KNOWN_TYPES,
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
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_ORDERED, sender_of
from iac.wire.seal import open_sealed

_COMMAND = int(MessageType.COMMAND)
_DELEGATE_TASK = int(MessageType.DELEGATE_TASK)
_CANCEL = int(MessageType.CANCEL)
_CREDIT = int(MessageType.CREDIT)
_FILE_TRANSFER = int(MessageType.FILE_TRANSFER)


class Route(IntEnum):
    """Where a delivered message goes."""

    #: its handler (:class:`~iac.node.dispatch.Dispatcher`)
    HANDLER = 0
    #: the reorder buffer of its ORDERED session, then its handler
    ORDERED = 1
    #: a CANCEL of a request this node handles
    CANCEL = 2
    #: a CREDIT of a stream this node produces
    CREDIT = 3
    #: the file receiver (FILE_TRANSFER)
    FILE = 4


@dataclass(slots=True)
class Refuse:
    """Refused: count ``reason``; answer ERROR ``reason.code`` when ``answer``. ``consumed``: the
    id reserved for it, to commit as the node acts on the refusal (in order with the messages
    before it: an ORDERED message's refusal still advances its reorder buffer)."""

    reason: Refusal
    detail: str
    answer: bool
    consumed: Key | None = None


@dataclass(slots=True)
class Duplicate:
    """A copy of a message already seen: ``TOO_OLD`` (behind the window), ``IN_PROGRESS`` (its
    first copy is being handled) or ``DONE`` (handled: answer again)."""

    verdict: Verdict
    answer: bool


@dataclass(slots=True)
class Response:
    """A REPLY, ERROR or ACK (``msg_type``) addressed to this node; ``key`` names the message it
    answers. ``store_failed``: the replay store could not be asked (delivered all the same: the
    pending table takes one answer only)."""

    msg: Message
    payload: Any
    key: Key
    msg_type: int
    store_failed: bool = False


#: An :class:`Item` is the decision to deliver it (to ``item.route``).
Decision = Refuse | Duplicate | Response | Item


class ReceivePipeline:
    """The checks between a received message and a handler, for one node."""

    def __init__(self, identity: Identity, config: NodeConfig, store: StoreRunner) -> None:
        self.identity = identity
        self.agent_id = identity.agent_id
        self.config = config
        self.store = store

    async def receive(
        self, conn: Connection, msgs: Sequence[Message], now: int, *, forwarded: bool = False
    ) -> list[Decision]:
        """The decision on each verified message of a batch from ``conn`` (``forwarded``: the
        inner messages of FORWARD frames it relayed), in order."""
        store = self.store
        fixed = store.freshness
        # The guard (a property that raises before the store is open) only when the store's
        # fixed window is unknown; else only for a message outside it.
        guard = store.guard if fixed is None else None
        # A MESSAGE frame's sender is the connection's peer (verify.py checked it); a FORWARD's
        # inner message names its origin.
        peer = conn.peer.agent_id
        via = peer if forwarded else None
        # Freshness (no store needed), then one store call for the batch: single-phase for a
        # response, a reservation for anything a handler takes.
        stale: dict[int, Refuse] = {}  # by position in the batch
        checks: list[CheckTuple] = []
        types: list[int] = []  # the msg_type of each checked message (a field is read once)
        for i, msg in enumerate(msgs):
            mt = msg.msg_type
            is_response = mt in RESPONSE_TYPES
            ts = msg.timestamp
            # Fresh by the store's fixed window (checked here), else as the guard says (it raises).
            if fixed is None or not now - fixed[0] <= ts <= now + fixed[0] or ts < fixed[1]:
                if guard is None:
                    guard = store.guard
                try:
                    guard.check_fresh(ts, now)
                except MessageRejected as exc:
                    stale[i] = self._stale(msg, now, exc, guard.store.max_skew_us, is_response, forwarded)
                    continue
            sender = sender_of(msg) if forwarded else peer
            checks.append(((sender, msg.session_id, msg.msg_id), is_response, via))
            types.append(mt)
        verdicts: list[Verdict | IacError] = []
        if checks:  # (a store that does not block is asked with no await)
            verdicts = await store.check(checks, now) if store.blocking else store.check_now(checks, now)
        out: list[Decision] = []
        j = 0  # the next verdict
        for i, msg in enumerate(msgs):
            if stale and i in stale:
                out.append(stale[i])
            else:
                out.append(self._judge(conn, msg, now, verdicts[j], forwarded, checks[j][0], types[j]))
                j += 1
        return out

    @staticmethod
    def _stale(
        msg: Message, now: int, exc: MessageRejected, max_skew: int, is_response: bool, forwarded: bool
    ) -> Refuse:
        answer = not is_response and not (forwarded and not msg.to)
        retried = bool(msg.flags & FLAG_ACK_REQUESTED)
        if abs(now - msg.timestamp) > max_skew:
            # An ACK_REQUESTED message is not answered: its sender retransmits, each copy
            # stamped afresh, and the first one after its clock is right gets through (an
            # ORDERED session needs every id; an ERROR would end the message for good).
            return Refuse(Refusal.STALE, f"stale: {exc}", answer and not retried)
        # Fresh, but before the store's history (it forgot everything when it started): not
        # the sender's fault. A retransmission (a fresh timestamp) gets through; a plain
        # request gets busy at once, like a store that cannot answer.
        return Refuse(Refusal.BEFORE_HISTORY, str(exc), answer and bool(msg.deadline) and not retried)

    def _judge(
        self,
        conn: Connection,
        msg: Message,
        now: int,
        verdict: Verdict | IacError,
        forwarded: bool,
        key: Key,
        mt: int,
    ) -> Decision:
        """Every step after the replay store's ``verdict`` on this message (``key``: the one it
        was checked under; ``mt``: its msg_type). Each field of the message is read once: a
        protobuf field read costs about as much as a Python call."""
        sender = key[0]
        broadcast = forwarded and not msg.to
        is_response = mt in RESPONSE_TYPES
        answer = not broadcast and not is_response
        if isinstance(verdict, IacError):
            if is_response and isinstance(verdict, StoreUnavailable):
                return self._response(msg, mt, sender, True)
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
            return self._response(msg, mt, sender, False)
        flags, deadline = msg.flags, msg.deadline
        try:
            refusal = self._check(msg, sender, broadcast)
            payload: Any = None
            sealed = bool(msg.sealed)
            if refusal is None and sealed:
                msg, refusal = self._unseal(msg)
            if refusal is None:
                payload, refusal = decode_payload(msg.payload_json)
            if refusal is None:
                refusal = self._check_late(msg, mt, deadline, sender, payload, now)
        except BaseException:
            self.store.release(key, now)
            raise
        if refusal is not None:
            return Refuse(refusal[0], refusal[1], not broadcast, key)
        if mt == _FILE_TRANSFER and not broadcast:
            route = Route.FILE
        elif mt == _CANCEL:
            route = Route.CANCEL
        elif mt == _CREDIT:
            route = Route.CREDIT
        elif flags & FLAG_ORDERED:
            route = Route.ORDERED
        else:
            route = Route.HANDLER
        if broadcast:
            wants = WANTS_NOTHING
        elif deadline:
            wants = WANTS_REPLY
        else:
            wants = WANTS_ACK if flags & FLAG_ACK_REQUESTED else WANTS_NOTHING
        return Item(
            conn, msg, payload, key, sealed, broadcast, wants=wants, route=route, received=now,
            msg_type=mt, deadline=deadline, flags=flags,
        )  # fmt: skip

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

    def _check_late(
        self, msg: Message, mt: int, deadline: int, sender: str, payload: Any, now: int
    ) -> tuple[Refusal, str] | None:
        c = self.config
        # Each check is called where it may refuse (a type not accepted, a task envelope or a
        # delegation, a deadline passed, a principal); what passes them all needs no call.
        r = None
        if mt not in (KNOWN_TYPES if c.allowed_types is None else c.allowed_types):
            r = check_type(msg, c.allowed_types)
        if r is None and (mt == _DELEGATE_TASK or msg.HasField("task")):
            r = check_task(msg, c.delegators, sender)
        if r is None and deadline and deadline <= now:
            r = check_deadline(msg, now)
        if r is None and msg.principal:
            r = check_principal(msg)
        if r is None and mt == _COMMAND:
            r = check_call(payload)
        if r is None and c.guards:
            r = run_guards(c.guards, msg, payload)
        return r

    def _response(self, msg: Message, mt: int, sender: str, store_failed: bool) -> Decision:
        if msg.to != self.agent_id:
            return Refuse(Refusal.NOT_ADDRESSED, "a response addressed to another agent", False)
        if msg.sealed:
            msg, r = self._unseal(msg)
            if r is not None:
                return Refuse(r[0], r[1], False)
        payload, r = decode_payload(msg.payload_json)
        if r is not None:
            return Refuse(r[0], r[1], False)
        return Response(msg, payload, (sender, msg.reply_session_id, msg.reply_to), mt, store_failed)


__all__ = ["Decision", "Duplicate", "Item", "ReceivePipeline", "Refuse", "Response", "Route"]
