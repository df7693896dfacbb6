"""Sending: build a message in the right session, sign it (fresh timestamp), frame it with the
connection's dictionary and put it on the connection that leads to its destination — directly, or
inside FORWARD through a relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from iac.errors import IacError
from iac.node.parts import Parts
from iac.node.peers import Peers
from iac.node.sign import Signer
from iac.node.types import Broadcast, payload_text
from iac.protocol.routing import Send
from iac.transport.base import Connection, PeerInfo
from iac.wire._pb.iac_pb2 import Message, TaskState
from iac.wire.dicts import Dictionary
from iac.wire.elide import ELIDE_CAPABILITY, FORWARD_CAPABILITY, compact_forward, elide, pair_prefix
from iac.wire.enums import type_name
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import check_agent_id_cached
from iac.wire.message import build_message, sign_message
from iac.wire.seal import seal_payload

#: Forward bodies larger than this are sent without trying zstd (file chunks do not compress).
COMPRESS_LIMIT = 64 * 1024
_MESSAGE_FRAME = FrameType.MESSAGE

log = logging.getLogger("iac.node")


class _Framing(NamedTuple):
    """What a connection's two HELLOs fix for the frames this side sends on it."""

    #: The peer (its HELLO) these were learnt from: a connection whose HELLO verified later
    #: (QUIC early data) has a new one, and its framing is learnt again.
    peer: PeerInfo
    #: The first dictionary the peer listed in its HELLO that this side has (until a pushed one
    #: is acknowledged: ``Connection.send_dictionary``).
    hello_dictionary: Dictionary | None
    #: The largest frame the peer takes and this side sends.
    limit: int
    #: ``from``/``to`` of this side's messages to the peer, left out of MESSAGE bodies when both
    #: HELLOs announce ``elide/1`` (else empty).
    elide_prefix: bytes


class Outbox:
    """Builds, signs, frames and sends this node's messages (requests, one-way messages, answers,
    broadcasts, Forwards)."""

    def __init__(self, parts: Parts, peers: Peers, signer: Signer) -> None:
        self.identity = identity = parts.identity
        #: Signs on the loop, or in batches on the crypto worker when many tasks send at once.
        self.signer = signer
        self.agent_id = identity.agent_id
        self.config = config = parts.config
        self.clock = config.transport.clock
        self.sessions = parts.sessions
        self._peers = peers
        self._router = parts.router
        self._c = parts.counters
        self._observers = parts.observers
        #: Per connection, what its HELLOs fix for its frames (:meth:`_learn_framing`).
        self._framing: weakref.WeakKeyDictionary[Connection, _Framing] = weakref.WeakKeyDictionary()

    def build(
        self,
        peer: str,
        msg_type: int,
        payload: Any,
        *,
        kind: str = "main",
        payload_json: str | None = None,
        extra_data: bytes = b"",
        flags: int = 0,
        task: TaskState | None = None,
        deadline_us: int = 0,
        reply_to: int = 0,
        reply_session_id: int = 0,
        sealed: bool = False,
        principal: str = "",
        now_us: int = 0,
    ) -> Message:
        """A new message toward ``peer`` in its session of ``kind`` (``now_us``: the clock, if the
        caller just read it; else read here)."""
        if not peer:  # (build_message checks a `to` that is not empty)
            check_agent_id_cached(peer)
        text = payload_json if payload_json is not None else payload_text(payload, None)
        now = now_us or self.clock.now_us()
        msg = build_message(
            sender=self.agent_id,
            to=peer,
            msg_type=msg_type,
            session=self.sessions.session(peer, kind, now),
            timestamp_us=now,
            payload_json=text,
            extra_data=extra_data,
            flags=flags,
            task=task,
            deadline_us=deadline_us,
            reply_to=reply_to,
            reply_session_id=reply_session_id,
        )
        if principal:
            msg.principal = principal
        if self._observers.items:
            self._observers.outgoing(msg)
        if sealed:
            text, extra = msg.payload_json, msg.extra_data
            msg.payload_json = ""
            msg.extra_data = b""
            seal_payload(self.identity, msg, msg.to, text, extra)
        return msg

    # --- toward a destination ---------------------------------------------------------------------

    async def transmit(
        self,
        peer: str,
        msg: Message,
        via: str | None = None,
        *,
        compress: bool = True,
        early: bool = True,
        now_us: int = 0,
    ) -> None:
        """Sign (fresh timestamp) and send toward ``peer``: inside FORWARD through ``via`` when given;
        else on the peer's connection; else through a route's next hop; else dial the peer.
        ``now_us``: the clock, when the caller built ``msg`` just now (its timestamp stands)."""
        conn = self._peers.table.get(peer) if via is None else None
        if conn is None:
            conn = await self._peers.first_hop(peer, via, now_us or self.clock.now_us())
            now_us = 0  # a dial may have taken a while: stamp afresh
        if conn.peer.agent_id == msg.to:
            await self.transmit_on(conn, msg, compress=compress, early=early, now_us=now_us)
        else:
            await self.forward_on(conn, msg, early=early)

    async def send_on(
        self, conn: Connection, msg: Message, *, compress: bool = True, early: bool = True
    ) -> None:
        """A MESSAGE frame when ``conn`` leads to ``msg.to`` itself, else a FORWARD through it."""
        if conn.peer.agent_id == msg.to:
            await self.transmit_on(conn, msg, compress=compress, early=early)
        else:
            await self.forward_on(conn, msg, early=early)

    async def send_to(self, to: str, msg: Message, hint: Connection | None = None, now_us: int = 0) -> None:
        """Send an answer: on ``hint`` when it is an open connection to ``to`` (the one the
        request came on: while a duplicate connection is settled, the table still names the old
        one), else the usual way. ``now_us``: the clock ``msg`` was built with just now."""
        if hint is not None and hint.peer.agent_id == to and not hint.closed:
            conn: Connection | None = hint
        else:
            conn = self._peers.table.get(to)
        if conn is not None:
            await self.transmit_on(conn, msg, now_us=now_us)
        else:
            await self.transmit(to, msg, now_us=now_us)

    async def try_send_to(self, to: str, msg: Message, hint: Connection | None = None) -> bool:
        """:meth:`send_to`, with transport errors swallowed (an answer nobody can take is lost)."""
        with contextlib.suppress(IacError):
            await self.send_to(to, msg, hint)
            return True
        return False

    async def send_control(
        self, peer: str, msg_type: int, request: Message, via: str | None, *, credit: int = 0
    ) -> None:
        """A CANCEL or CREDIT naming ``request``, if ``peer`` is reachable without dialing; never
        raises (it is best effort: the request's deadline ends it anyway)."""
        with contextlib.suppress(IacError):
            now = self.clock.now_us()
            reachable = (
                self._peers.table.get(peer) is not None or self._peers.route_hop(peer, now) is not None
            )
            if via is None and not reachable:
                return
            msg = self.build(
                peer, msg_type, None, reply_to=request.msg_id, reply_session_id=request.session_id
            )
            if credit:
                msg.credit = credit
            await self.transmit(peer, msg, via)

    # --- on one connection ------------------------------------------------------------------------

    def frame_params(self, conn: Connection) -> tuple[Dictionary | None, int]:
        """The dictionary to compress with toward ``conn`` and the largest frame its peer takes."""
        framing = self._framing.get(conn)
        if framing is None or framing.peer is not conn.peer:
            framing = self._learn_framing(conn)
        # The dictionary this side pushed once the peer acknowledged it, else the first one
        # the peer listed in its HELLO.
        return conn.send_dictionary or framing.hello_dictionary, framing.limit

    def _learn_framing(self, conn: Connection) -> _Framing:
        """What the two HELLOs of ``conn`` fix for its frames (kept while its peer's HELLO is the
        same, and while the connection is referenced elsewhere)."""
        peer = conn.peer
        hello = peer.hello
        transport = self.config.transport
        # elides(): both HELLOs proved from/to, so MESSAGE bodies go without them
        elides = ELIDE_CAPABILITY in conn.local_hello.capabilities and ELIDE_CAPABILITY in hello.capabilities
        framing = _Framing(
            peer,
            transport.dictionaries.choose(hello.dict_ids),
            min(transport.max_frame_size, hello.max_frame_size or 1 << 30),
            pair_prefix(self.agent_id, peer.agent_id) if elides else b"",
        )
        self._framing[conn] = framing
        return framing

    async def transmit_on(
        self, conn: Connection, msg: Message, *, compress: bool = True, early: bool = True, now_us: int = 0
    ) -> None:
        """Sign ``msg`` with a fresh timestamp (``now_us``: the clock the caller built it with just
        now, its timestamp already) and send it in a MESSAGE frame on ``conn``."""
        if not now_us:
            msg.timestamp = self.clock.now_us()
        signer = self.signer
        body = sign_message(self.identity, msg) if signer.worker is None else await signer.sign(msg)
        # frame_params(conn), written out (a call per message saved)
        framing = self._framing.get(conn)
        if framing is None or framing.peer is not conn.peer:
            framing = self._learn_framing(conn)
        if framing.elide_prefix:
            body = elide(body, framing.elide_prefix)
        dictionary = conn.send_dictionary or framing.hello_dictionary
        frame = encode_frame(
            _MESSAGE_FRAME, body, compress_with=dictionary if compress else None, max_frame_size=framing.limit
        )
        if not conn.try_send(frame, early=early):
            await conn.send(frame, early=early)
        self._c.sent += 1
        self._c.bytes_sent += len(frame)

    async def forward_on(self, conn: Connection, msg: Message, *, early: bool = True) -> None:
        """Sign ``msg`` and send it inside a FORWARD to the relay at the other end of ``conn``."""
        now = self.clock.now_us()
        msg.timestamp = now
        body = await self.signer.sign(msg)
        relay = conn.peer.agent_id
        send = self._router.originate(body, (relay,), now, via=relay)
        await self.send_forward(conn, send.data, early=early)
        self._c.sent += 1

    async def send_forward(self, conn: Connection, data: bytes, *, early: bool = True) -> None:
        dictionary, limit = self.frame_params(conn)
        # forwards_elided(): the origin once, raw; the receiver restores path ends, from and to
        if (
            FORWARD_CAPABILITY in conn.local_hello.capabilities
            and FORWARD_CAPABILITY in conn.peer.hello.capabilities
        ):
            data = compact_forward(data, self.agent_id, conn.peer.agent_id)
        frame = encode_frame(
            FrameType.FORWARD,
            data,
            compress_with=dictionary if len(data) <= COMPRESS_LIMIT else None,
            max_frame_size=limit,
        )
        if not conn.try_send(frame, early=early):
            await conn.send(frame, early=early)
        self._c.bytes_sent += len(frame)

    async def send_all(self, conns: Mapping[str, Connection], sends: Sequence[Send]) -> None:
        """Send Forwards to several peers at once (one slow peer does not hold up the others)."""
        jobs = [self.send_forward(conns[s.peer], s.data) for s in sends if s.peer in conns]
        if len(jobs) == 1:
            with contextlib.suppress(IacError):
                await jobs[0]
            return
        for res in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(res, BaseException) and not isinstance(res, IacError):
                raise res

    async def broadcast(
        self, msg_type: int, text: str, extra_data: bytes, hop_limit: int | None
    ) -> Broadcast:
        now = self.clock.now_us()
        msg = build_message(
            sender=self.agent_id,
            to="",
            msg_type=msg_type,
            session=self.sessions.session("", "broadcast", now),
            timestamp_us=now,
            payload_json=text,
            extra_data=extra_data,
        )
        if self._observers.items:
            self._observers.outgoing(msg)
        body = await self.signer.sign(msg)
        conns = self._peers.by_id()
        sends = self._router.originate_broadcast(body, conns, now, hop_limit)
        await self.send_all(conns, sends)
        self._c.sent += 1
        if not sends:
            self._c.broadcasts_unsent += 1
            log.warning("broadcast %s reached no peer: this node has no connection", type_name(msg_type))
        return Broadcast(msg.session_id, msg.msg_id, len(sends))


__all__ = ["COMPRESS_LIMIT", "Outbox"]
