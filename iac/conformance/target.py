"""The node under test as the cases see it (:class:`Target`), what a case returns
(:class:`Outcome`), and the case table they register in (:data:`CASES`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from iac.conformance import link as links
from iac.conformance.peer import Closed, Dialed, NoAnswer, Peer, client_handshake
from iac.errors import CloseCode, TransportError
from iac.protocol.handshake import encode_goaway
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType, type_name
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity

MAX_SKEW_US = 60_000_000


@dataclass
class Outcome:
    """What a case's check returns: passed or not, with what it expected and what it saw."""

    passed: bool
    expected: str
    seen: str


class Failed(Exception):
    """A case that cannot go on: ``seen`` is what happened instead."""

    def __init__(self, seen: str) -> None:
        super().__init__(seen)
        self.seen = seen


@dataclass
class Target:
    """The node under test and what the run learnt about it."""

    url: str
    to: str
    timeout: float
    identity: Identity = field(default_factory=Identity.generate)
    reached: bool = False  # an IAC HELLO came back at least once
    case_deadline: float = 0.0  # set by the runner: when the running case must end
    _first: Dialed | None = None
    _witness: Peer | None = None
    _witness_key: Identity = field(default_factory=Identity.generate)
    _open: list[Peer] = field(default_factory=list)

    @property
    def transport(self) -> str:
        return self.url.split(":", 1)[0]

    def deadline(self) -> float:
        return self.case_deadline or time.monotonic() + self.timeout

    async def dial(self, identity: Identity | None = None, **kw: object) -> Dialed:
        """A connection with the HELLO exchange run (not judged). Each has a key of its own unless
        ``identity`` is given: a second connection of one key is another rule (section 6)."""
        try:
            link = await links.dial(
                self.url, max(self.deadline() - time.monotonic(), 0.01), said=self.timeout
            )
        except TransportError as exc:
            raise Failed(str(exc)) from None
        me = identity or Identity.generate()
        d = await client_handshake(link, me, self.to, self.deadline(), **kw)  # type: ignore[arg-type]
        self._open.append(d.peer)
        if d.server is not None or (d.closed and d.closed.code is not None):
            self.reached = True  # the other side speaks IAC: a frame, a GOAWAY or a close code came back
        return d

    async def session(self, identity: Identity | None = None) -> Peer:
        """A connection whose handshake went through (judged by the hello.* cases, not here).

        With ``identity`` (a key used again: the vectors' signer, the witness) the connection is
        confirmed by a PING first, and dialed again while the node closes it with GOING_AWAY:
        its previous connection of that key may not be gone yet on the node's side."""
        while True:
            d = await self.dial(identity)
            if d.closed is not None:
                raise Failed(f"the handshake was refused: {d.closed.describe()}")
            assert d.server is not None
            if d.server.error:
                raise Failed(f"the node's HELLO: {d.server.error}")
            if identity is None:
                return d.peer
            _, got = await d.peer.request(self.to, MessageType.PING, self.deadline())
            if isinstance(got, Message):
                return d.peer
            d.peer.link.close()
            if got.code != CloseCode.GOING_AWAY:
                raise Failed(f"the node refused the tester's HELLO: {got.describe()}")

    async def first(self) -> Dialed:
        """One honest handshake, shared by the hello.* cases."""
        if self._first is None:
            self._first = await self.dial(self.identity)
        return self._first

    async def serves(self) -> str:
        """ "" when a PING on another connection (the witness) is answered, else what happened."""
        for attempt in (1, 2):
            try:
                if self._witness is None or self._witness.closed is not None:
                    self._witness = await self.session(self._witness_key)
                    self._open.remove(self._witness)
                _, answer = await self._witness.request(self.to, MessageType.PING, self.deadline())
            except NoAnswer:
                return f"another connection's PING: no answer in {self.timeout:g} s"
            except Failed as exc:
                return f"another connection: {exc.seen}"
            if isinstance(answer, Message) and int(answer.msg_type) == MessageType.REPLY:
                return ""
            if attempt == 2:
                return f"another connection's PING: {describe(answer)}"
            self._witness = None  # closed in between (idle): dial once more
        return "unreachable"

    async def end_case(self) -> None:
        """Close what the case opened, politely (GOAWAY, then wait for the node's end briefly), so
        that the next connection of the same key is not a duplicate."""
        peers, self._open = self._open, []
        first = self._first.peer if self._first else None
        await asyncio.gather(*(goodbye(p) for p in peers if p is not first))

    def close(self) -> None:
        for p in (self._witness, self._first.peer if self._first else None, *self._open):
            if p is not None:
                p.link.close()


async def goodbye(peer: Peer, seconds: float = 1.0) -> None:
    """GOAWAY NO_ERROR, then wait (at most ``seconds``) for the other side to end the connection."""
    if peer.closed is None and peer.link.transport != "quic":  # QUIC: the close itself says NO_ERROR
        with contextlib.suppress(Exception):  # whatever state the link is in, it is being dropped
            await peer.send_raw(encode_frame(FrameType.GOAWAY, encode_goaway(0, "case done")), control=True)
            await peer.close_seen(time.monotonic() + seconds)
    peer.link.close()


def describe(got: Message | Closed) -> str:
    if isinstance(got, Closed):
        return got.describe()
    name = type_name(got.msg_type)
    return f"{name} {got.payload_json[:120]!r}"


def error_code(msg: Message) -> str:
    try:
        value = json.loads(msg.payload_json)
    except Exception:  # the node sent something that is not JSON: say so
        return "<not JSON>"
    return str(value.get("code")) if isinstance(value, dict) else "<not an object>"


_CAPABILITY = re.compile(r"[a-z][a-z0-9-]{0,31}/[1-9][0-9]*|instance/[0-9a-f]{16}")


def capability_faults(capabilities: Sequence[str]) -> str:
    """What is wrong with a HELLO's ``capabilities`` (section 18, "Capabilities"), "" if nothing."""
    bad = [c for c in capabilities if not _CAPABILITY.fullmatch(c)]
    if bad:
        return f"not name/version: {bad[:3]}"
    if len(set(capabilities)) != len(capabilities):
        return "an entry announced twice"
    if len(capabilities) > 64:
        return f"{len(capabilities)} entries, above 64"
    return ""


@dataclass(frozen=True)
class Case:
    """A conformance case: its id, the section and sentence of docs/PROTOCOL.md it checks, the
    check itself, and the transports it runs on."""

    id: str
    section: str
    quote: str
    run: Callable[[Target], Awaitable[Outcome]]
    transports: tuple[str, ...] = ("quic", "tls", "unix")


#: Every case of the server-role suite, in the order they run (filled by :func:`case`).
CASES: list[Case] = []


def case(
    cid: str, section: str, quote: str, transports: tuple[str, ...] = ("quic", "tls", "unix")
) -> Callable[[Callable[[Target], Awaitable[Outcome]]], Callable[[Target], Awaitable[Outcome]]]:
    def add(fn: Callable[[Target], Awaitable[Outcome]]) -> Callable[[Target], Awaitable[Outcome]]:
        CASES.append(Case(cid, section, quote, fn, transports))
        return fn

    return add


def check(expected: str, seen: str) -> Outcome:
    return Outcome(expected == seen, expected, seen)


__all__ = [
    "CASES",
    "Case",
    "Failed",
    "Outcome",
    "Target",
    "case",
    "check",
    "describe",
    "error_code",
    "goodbye",
]
