"""The tester's side of one IAC connection: HELLOs built and judged field by field, frames sent
as given, frames and closes read back.

Nothing here refuses on its own: the tester wants to *see* what the implementation did (which
HELLO it sent, which close code it chose), so a :class:`Peer` reports instead of raising.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from iac.conformance.link import Data, Ended, Link
from iac.errors import IacError
from iac.protocol.clock import now_us
from iac.protocol.handshake import NONCE_SIZE, HelloParams, Role, build_hello, close_code_name, decode_goaway
from iac.wire._pb.iac_pb2 import Hello, Message
from iac.wire.enums import MessageType
from iac.wire.frames import Frame, FrameDecoder, FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ACK_REQUESTED, Session, build_message, open_hello, open_message, sign_hello


class NoAnswer(Exception):
    """Nothing arrived within a case's timeout (turned into "no answer in N s")."""


@dataclass(frozen=True)
class Closed:
    """How the implementation ended the connection: ``code`` from its GOAWAY or QUIC close, None
    when the connection just ended."""

    code: int | None
    reason: str
    via: str  # "goaway", "quic", "end"

    def describe(self) -> str:
        if self.code is None:
            return f"connection ended without a close code ({self.reason})"
        return f"close 0x{self.code:02x} {close_code_name(self.code)} ({self.via}: {self.reason[:80]})"


@dataclass
class Received:
    frames: list[Frame] = field(default_factory=list)
    closed: Closed | None = None


class Peer:
    """Frames over a :class:`Link`; one decoder per stream."""

    def __init__(self, link: Link, identity: Identity, *, max_frame_size: int = 4 * 1024 * 1024) -> None:
        self.link = link
        self.identity = identity
        self.session = Session()
        self._decoders: dict[int, FrameDecoder] = {}
        self._max = max_frame_size
        self._pending: list[Frame] = []
        self.closed: Closed | None = None
        self.local_fault = ""  # what the implementation sent that this side could not decode

    # --- reading -------------------------------------------------------------------------------

    def _feed(self, ev: Data) -> list[Frame]:
        if ev.reset:
            self._decoders.pop(ev.stream, None)
            return []
        dec = self._decoders.setdefault(ev.stream, FrameDecoder(max_frame_size=self._max))
        try:
            frames = dec.feed(ev.data, final=ev.end)
        except IacError as exc:
            self.local_fault = f"undecodable frame from the implementation: {exc.reason}: {exc}"
            self.closed = Closed(None, self.local_fault, "end")
            return []
        if ev.end:
            self._decoders.pop(ev.stream, None)
        return frames

    async def frame(self, deadline: float) -> Frame | Closed:
        """The next frame, or how the connection ended; :class:`NoAnswer` at ``deadline``
        (a ``time.monotonic()`` value)."""
        while True:
            if self._pending:
                return self._pending.pop(0)
            if self.closed is not None:
                return self.closed
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer
            try:
                ev = await asyncio.wait_for(self.link.events.get(), left)
            except TimeoutError:
                raise NoAnswer from None
            if isinstance(ev, Ended):
                if self.closed is None:
                    via = "quic" if ev.code is not None else "end"
                    self.closed = Closed(ev.code, ev.reason, via)
                continue
            for fr in self._feed(ev):
                if fr.type is FrameType.GOAWAY and self.closed is None:
                    code, reason = decode_goaway(fr.body)
                    self.closed = Closed(code, reason, "goaway")
                elif self.closed is None:
                    self._pending.append(fr)

    async def close_seen(self, deadline: float) -> Closed:
        """Read (and drop) frames until the connection ends."""
        while True:
            got = await self.frame(deadline)
            if isinstance(got, Closed):
                return got

    async def message(self, deadline: float, match: Callable[[Message], bool]) -> Message | Closed:
        """The next verified MESSAGE that ``match`` accepts (others are skipped)."""
        while True:
            got = await self.frame(deadline)
            if isinstance(got, Closed):
                return got
            if got.type is not FrameType.MESSAGE:
                continue
            try:
                msg = open_message(got.body)
            except IacError as exc:
                self.local_fault = f"a MESSAGE from the implementation does not verify: {exc.reason}"
                continue
            if match(msg):
                return msg

    # --- writing -------------------------------------------------------------------------------

    async def send_raw(self, data: bytes, *, control: bool = False) -> None:
        """Bytes as given: on QUIC a unidirectional stream of their own unless ``control``."""
        await self.link.send(data, control=control or self.link.transport != "quic")

    def build(
        self,
        to: str,
        msg_type: int,
        *,
        flags: int = 0,
        payload: str = "",
        deadline_s: float = 0.0,
        timestamp_us: int | None = None,
    ) -> Message:
        ts = now_us() if timestamp_us is None else timestamp_us
        return build_message(
            sender=self.identity.agent_id,
            to=to,
            msg_type=msg_type,
            session=self.session,
            timestamp_us=ts,
            payload_json=payload,
            flags=flags,
            deadline_us=ts + int(deadline_s * 1e6) if deadline_s else 0,
        )

    async def send_message(self, msg: Message, *, signer: Identity | None = None) -> bytes:
        """Sign (by ``signer``, default this side) and send; returns the frame bytes."""
        from iac.wire.message import sign_message

        body = sign_message(signer or self.identity, msg)
        frame = encode_frame(FrameType.MESSAGE, body)
        await self.send_raw(frame)
        return frame

    async def request(
        self, to: str, msg_type: int, deadline: float, **kw: object
    ) -> tuple[Message, Message | Closed]:
        msg = self.build(to, msg_type, deadline_s=max(deadline - time.monotonic(), 1.0), **kw)  # type: ignore[arg-type]
        await self.send_message(msg)
        return msg, await self.message(deadline, lambda m: answers(m, msg))


def answers(answer: Message, request: Message) -> bool:
    """Whether ``answer`` names ``request`` by ``(reply_session_id, reply_to)``."""
    return (
        int(answer.msg_type) in (MessageType.REPLY, MessageType.ERROR, MessageType.ACK)
        and answer.reply_to == request.msg_id
        and answer.reply_session_id == request.session_id
    )


# --- HELLOs ------------------------------------------------------------------------------------


@dataclass
class HelloSeen:
    """The implementation's HELLO as received, opened without judging it (``error``: it did not
    parse or verify)."""

    raw: bytes = b""
    hello: Hello | None = None
    error: str = ""
    received_us: int = 0
    compressed: bool = False  # a HELLO frame with the zstd flag (HELLOs go raw, section 4)


#: Changes a HELLO before it is signed, or replaces the signed bytes (returns them).
Forge = Callable[[Hello], bytes | None]


def make_hello(
    identity: Identity,
    role: Role,
    *,
    nonce: bytes,
    binding: bytes,
    peer_nonce: bytes = b"",
    peer_agent_id: str = "",
    forge: Forge | None = None,
) -> bytes:
    hello = build_hello(
        identity,
        now_us=now_us(),
        nonce=nonce,
        params=HelloParams(session_id=secrets.randbits(63) | 1),
        peer_nonce=peer_nonce,
        peer_agent_id=peer_agent_id,
        binding=binding,
    )
    if forge is not None:
        raw = forge(hello)
        if raw is not None:
            return raw
    body = sign_hello(identity, hello, role.domain)
    return encode_frame(FrameType.HELLO, body)


async def read_hello(peer: Peer, sender: Role, deadline: float) -> HelloSeen | Closed:
    """The implementation's HELLO, or how it closed instead."""
    got = await peer.frame(deadline)
    if isinstance(got, Closed):
        return got
    seen = HelloSeen(raw=got.body, received_us=now_us(), compressed=got.dict_id is not None)
    if got.type is not FrameType.HELLO:
        seen.error = f"a {got.type.name} frame instead of HELLO"
        return seen
    try:
        seen.hello = open_hello(got.body, sender.domain)
    except IacError as exc:
        seen.error = f"{exc.reason}: {exc}"
    return seen


@dataclass
class Dialed:
    """A client handshake, judged by nobody yet: what the tester sent and what it got back."""

    peer: Peer
    nonce: bytes
    sent: bytes
    server: HelloSeen | None = None
    closed: Closed | None = None


async def client_handshake(
    link: Link,
    identity: Identity,
    to: str,
    deadline: float,
    *,
    forge: Forge | None = None,
    replay: bytes = b"",
) -> Dialed:
    """Run the dialing side's half of the exchange (section 6), in the transport's order.
    ``replay``: send these HELLO frame bytes instead of a fresh HELLO."""
    peer = Peer(link, identity)
    nonce = secrets.token_bytes(NONCE_SIZE)
    if link.client_first:
        sent = replay or make_hello(
            identity, Role.CLIENT, nonce=nonce, binding=link.binding, peer_agent_id=to, forge=forge
        )
        await peer.send_raw(sent, control=True)
        got = await read_hello(peer, Role.SERVER, deadline)
        if isinstance(got, Closed):
            return Dialed(peer, nonce, sent, closed=got)
        return Dialed(peer, nonce, sent, server=got)
    got = await read_hello(peer, Role.SERVER, deadline)
    if isinstance(got, Closed):
        return Dialed(peer, nonce, b"", closed=got)
    peer_nonce = got.hello.nonce if got.hello is not None else b""
    sent = replay or make_hello(
        identity, Role.CLIENT, nonce=nonce, binding=b"", peer_nonce=peer_nonce, peer_agent_id=to, forge=forge
    )
    await peer.send_raw(sent, control=True)
    return Dialed(peer, nonce, sent, server=got)


__all__ = [
    "FLAG_ACK_REQUESTED",
    "Closed",
    "Dialed",
    "Forge",
    "HelloSeen",
    "NoAnswer",
    "Peer",
    "answers",
    "client_handshake",
    "make_hello",
    "read_hello",
]
