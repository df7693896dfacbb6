"""``--client``: the tester listens, the implementation dials, and the tester judges its client role.

For each connection: the client's HELLO field by field (signature in the client domain,
binding to the tester's certificate, nonce and echo, freshness, the named peer), then every
MESSAGE it sends (signed by the peer its HELLO proved, addressed to the tester), answered as a
node would answer (REPLY ``null`` to a PING, the payload echoed to another request, ACK to a
one-way ACK_REQUESTED message), and how it closes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from iac.conformance.link import Link, Server
from iac.conformance.peer import Closed, HelloSeen, NoAnswer, Peer, make_hello, read_hello
from iac.conformance.runner import DEFAULT_TIMEOUT, CaseResult, Report
from iac.conformance.target import Outcome, capability_faults
from iac.errors import CloseCode, IacError
from iac.protocol.clock import now_us
from iac.protocol.handshake import NONCE_SIZE, PROTOCOL_VERSION, Role, encode_goaway
from iac.transport.certs import generate_self_signed
from iac.wire._pb.iac_pb2 import Hello, Message
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Domain, Identity
from iac.wire.message import (
    FLAG_ACK_REQUESTED,
    Session,
    build_message,
    open_message,
    sender_of,
    sign_hello,
    sign_message,
)

#: Seconds ``--client`` waits for each connection (``--wait``).
DEFAULT_WAIT = 30.0

#: id -> (section, quoted sentence) of the client-role cases.
CLIENT_CASES: dict[str, tuple[str, str]] = {
    "client.connect": ("6 HELLO", "Every connection starts with a HELLO exchange."),
    "client.hello.signature": (
        "6 HELLO",
        "in the domain of its sender's role: `iac-hello-client-v1` for the dialing side",
    ),
    "client.hello.binding": (
        "6 HELLO",
        "`channel_binding` | SHA-256 of the server's certificate (DER) as the "
        "sender saw it; empty on UNIX sockets",
    ),
    "client.hello.nonce": (
        "6 Roles and orders",
        "the client sends HELLO with `peer_nonce` empty … The client's "
        "HELLO echoes the server's nonce in `peer_nonce`",
    ),
    "client.hello.identity": (
        "6 Roles and orders",
        "`peer_agent_id` = the AgentId it dialed (when it dialed "
        "one) … and names the server in `peer_agent_id`",
    ),
    "client.hello.freshness": (
        "6 Checks on a received HELLO",
        "`|now − timestamp| ≤ max_skew`: else `stale_hello` (0x13)",
    ),
    "client.hello.fields": (
        "6 HELLO",
        "`version` | 1; `nonce` | exactly 16 random bytes. (4) HELLO frames MUST be sent raw",
    ),
    "client.message.signed": (
        "6 After the handshake",
        "A verified `from` other than the peer that this "
        "connection's HELLO proved closes the connection with `impersonation` (0x18)",
    ),
    "client.message.after_hello": (
        "6 Roles and orders",
        "A client MUST NOT send a MESSAGE before it has "
        "verified the server's HELLO, except as 0-RTT early data",
    ),
    "client.close": (
        "6 Closing, idle and flow control",
        "A normal close sends GOAWAY `0x00 NO_ERROR` after the queued frames … A node that shuts down "
        "sends `0x21 GOING_AWAY`.",
    ),
}


@dataclass
class _Judge:
    """The outcomes of one connection, by case id."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    hello_seen: bool = False

    def put(self, cid: str, passed: bool, expected: str, seen: str) -> None:
        if cid in self.outcomes and not self.outcomes[cid].passed:
            return  # the first failure of a case is the one reported
        self.outcomes[cid] = Outcome(passed, expected, seen)


def _judge_hello(
    j: _Judge, seen: HelloSeen, *, me: Identity, binding: bytes, server_nonce: bytes | None
) -> Hello | None:
    j.hello_seen = seen.hello is not None or bool(seen.raw)
    j.put(
        "client.hello.signature",
        not seen.error,
        "a HELLO that verifies in iac-hello-client-v1",
        seen.error or "a HELLO that verifies in iac-hello-client-v1",
    )
    h = seen.hello
    if h is None:
        return None
    j.put(
        "client.hello.binding",
        h.channel_binding == binding,
        binding.hex() or "(empty)",
        h.channel_binding.hex() or "(empty)",
    )
    want_echo = server_nonce.hex() if server_nonce is not None else "(empty)"
    j.put(
        "client.hello.nonce",
        (h.peer_nonce.hex() or "(empty)") == want_echo,
        f"peer_nonce {want_echo}",
        f"peer_nonce {h.peer_nonce.hex() or '(empty)'}",
    )
    named_ok = h.peer_agent_id == me.agent_id or (server_nonce is None and not h.peer_agent_id)
    want = me.agent_id[:16] + "…" + (" (or empty)" if server_nonce is None else "")
    j.put(
        "client.hello.identity",
        named_ok,
        f"peer_agent_id {want}",
        f"peer_agent_id {h.peer_agent_id[:16] or '(empty)'}",
    )
    skew = (h.timestamp - seen.received_us) / 1e6
    j.put(
        "client.hello.freshness",
        abs(skew) <= 60,
        "timestamp within 60 s of the tester's clock",
        f"{skew:+.3f} s",
    )
    ok = (
        h.version == PROTOCOL_VERSION
        and len(h.nonce) == NONCE_SIZE
        and (h.max_frame_size == 0 or h.max_frame_size >= 1024)
    )
    caps = capability_faults(h.capabilities)
    j.put(
        "client.hello.fields",
        ok and not caps and not seen.compressed,
        "a raw HELLO frame, version 1, nonce of 16 bytes, max_frame_size 0 or ≥ 1024, capabilities of the "
        "form name/version",
        f"a {'compressed' if seen.compressed else 'raw'} HELLO frame, "
        f"version {h.version}, nonce of {len(h.nonce)} bytes, max_frame_size {h.max_frame_size}, "
        f"capabilities {list(h.capabilities)}" + (f" ({caps})" if caps else ""),
    )
    return h


class _Answerer:
    def __init__(self, me: Identity, peer: Peer) -> None:
        self.me = me
        self.peer = peer
        self.session = Session()

    async def answer(self, msg: Message, msg_type: int, payload: str) -> None:
        reply = build_message(
            sender=self.me.agent_id,
            to=sender_of(msg),
            msg_type=msg_type,
            session=self.session,
            timestamp_us=now_us(),
            payload_json=payload,
            reply_to=msg.msg_id,
            reply_session_id=msg.session_id,
        )
        await self.peer.send_raw(encode_frame(FrameType.MESSAGE, sign_message(self.me, reply)))


@dataclass(frozen=True)
class Refusal:
    """A forged server HELLO the dialing side must refuse with ``code`` (``unix_code`` on UNIX)."""

    id: str
    section: str
    quote: str
    forge: Callable[[Identity], Callable[[Hello], bytes | None]]
    code: int
    unix_code: int


def _flip(me: Identity) -> Callable[[Hello], bytes | None]:
    def forge(h: Hello) -> bytes:
        raw = sign_hello(me, h, Domain.HELLO_SERVER)
        return encode_frame(FrameType.HELLO, raw[:-1] + bytes([raw[-1] ^ 1]))

    return forge


def _other_signer(h: Hello) -> bytes:
    """A HELLO that verifies, by a key the client did not dial."""
    other = Identity.generate()
    h.agent_id = other.agent_id
    return encode_frame(FrameType.HELLO, sign_hello(other, h, Domain.HELLO_SERVER))


def _setting(**fields: object) -> Callable[[Identity], Callable[[Hello], bytes | None]]:
    def maker(me: Identity) -> Callable[[Hello], bytes | None]:
        def forge(h: Hello) -> None:
            for k, v in fields.items():
                setattr(h, k, v(h) if callable(v) else v)

        return forge

    return maker


_CHECKS = "6 Checks on a received HELLO"
#: ``--refusals``: the first connections each get one of these instead of an honest HELLO.
REFUSALS = (
    Refusal(
        "client.refuse.signature",
        _CHECKS,
        "`agent_id` is an AgentId (else `invalid_agent_id`) and the signature verifies by it in the "
        "sender role's domain (else `bad_signature`): either refusal closes with `0x11 BAD_HELLO_SIGNATURE`",
        _flip,
        0x11,
        0x11,
    ),
    Refusal(
        "client.refuse.stale",
        _CHECKS,
        "`|now − timestamp| ≤ max_skew`: else `stale_hello` (0x13)",
        _setting(timestamp=lambda h: h.timestamp - 3_600_000_000),
        0x13,
        0x13,
    ),
    Refusal(
        "client.refuse.binding",
        _CHECKS,
        "`channel_binding` equals this connection's binding (section 7; "
        "empty on UNIX), compared in constant time: else `channel_binding_mismatch` (0x15)",
        _setting(channel_binding=b"\x01" * 32),
        0x15,
        0x15,
    ),
    Refusal(
        "client.refuse.nonce",
        _CHECKS,
        "Client first: `peer_nonce` equals the client's nonce "
        "(`replayed_hello`, 0x14) … Server first: `peer_nonce` is empty (0x10).",
        _setting(peer_nonce=b"\x02" * 16),
        0x14,
        0x10,
    ),
    Refusal(
        "client.refuse.identity",
        _CHECKS,
        "**Client**, on the server's HELLO: its `agent_id` is the AgentId "
        "that was dialed, when one was (`wrong_peer`, 0x12)",
        lambda me: _other_signer,
        0x12,
        0x12,
    ),
)

ALL_CLIENT_CASES = {**CLIENT_CASES, **{r.id: (r.section, r.quote) for r in REFUSALS}}


async def refuse_connection(link: Link, me: Identity, refusal: Refusal, timeout: float) -> _Judge:
    """Send ``refusal``'s forged HELLO where the honest one would go and see how the client closes."""
    j = _Judge()
    peer = Peer(link, me)
    deadline = time.monotonic() + timeout
    code = refusal.code if link.client_first else refusal.unix_code
    want = f"close 0x{code:02x} {CloseCode(code).name.lower()}"
    try:
        forge = refusal.forge(me)
        if link.client_first:
            got = await read_hello(peer, Role.CLIENT, deadline)
            if isinstance(got, Closed) or got.hello is None:
                j.put(refusal.id, False, want, "no client HELLO to answer")
                return j
            j.hello_seen = True
            hello = make_hello(
                me,
                Role.SERVER,
                nonce=secrets.token_bytes(NONCE_SIZE),
                binding=link.binding,
                peer_nonce=got.hello.nonce,
                peer_agent_id=got.hello.agent_id,
                forge=forge,
            )
        else:
            hello = make_hello(
                me, Role.SERVER, nonce=secrets.token_bytes(NONCE_SIZE), binding=b"", forge=forge
            )
        await peer.send_raw(hello, control=True)
        closed = await peer.close_seen(deadline)
        j.hello_seen = True
        j.put(refusal.id, closed.code == code, want, closed.describe())
    except NoAnswer:
        j.put(refusal.id, False, want, f"the connection stayed open {timeout:g} s")
    finally:
        link.close()
    return j


async def judge_connection(link: Link, me: Identity, timeout: float, wait: float) -> _Judge:
    j = _Judge()
    peer = Peer(link, me)
    deadline = time.monotonic() + timeout
    server_nonce = secrets.token_bytes(NONCE_SIZE)
    try:
        if not link.client_first:
            await peer.send_raw(make_hello(me, Role.SERVER, nonce=server_nonce, binding=b""), control=True)
        got = await read_hello(peer, Role.CLIENT, deadline)
        if isinstance(got, Closed):
            j.put("client.connect", False, "a client HELLO", got.describe())
            return j
        j.put("client.connect", True, "a client HELLO", "a client HELLO")
        if got.error.startswith("a ") and got.error.endswith("instead of HELLO"):
            j.put("client.message.after_hello", False, "HELLO first", got.error)
        h = _judge_hello(
            j, got, me=me, binding=link.binding, server_nonce=None if link.client_first else server_nonce
        )
        if h is None or not all(o.passed for o in j.outcomes.values()):
            await peer.send_raw(
                encode_frame(
                    FrameType.GOAWAY, encode_goaway(CloseCode.HANDSHAKE_FAILED, "refused by the tester")
                ),
                control=True,
            )
            return j
        if link.client_first:
            await peer.send_raw(
                make_hello(
                    me,
                    Role.SERVER,
                    nonce=server_nonce,
                    binding=link.binding,
                    peer_nonce=h.nonce,
                    peer_agent_id=h.agent_id,
                ),
                control=True,
            )
        await _serve(j, peer, me, h, deadline=time.monotonic() + wait)
    except NoAnswer:
        j.put("client.connect", False, "a client HELLO, then its messages", f"no answer in {timeout:g} s")
    finally:
        link.close()
    return j


async def _serve(j: _Judge, peer: Peer, me: Identity, h: Hello, *, deadline: float) -> None:
    answerer = _Answerer(me, peer)
    while True:
        try:
            got = await peer.frame(deadline)
        except NoAnswer:
            j.put("client.close", False, "GOAWAY 0x00 no_error", "the connection stayed open")
            return
        if isinstance(got, Closed) and peer.local_fault:  # a frame the tester's limits refuse
            j.put(
                "client.message.signed", False, "frames within the tester's max_frame_size", peer.local_fault
            )
            return
        if isinstance(got, Closed):
            normal = got.code in (CloseCode.NO_ERROR, CloseCode.GOING_AWAY)
            j.put("client.close", normal, "close 0x00 no_error or 0x21 going_away", got.describe())
            return
        if got.type is FrameType.HELLO:
            j.put("client.message.after_hello", False, "one HELLO per connection", "a second HELLO")
            continue
        if got.type is not FrameType.MESSAGE:
            continue
        try:
            msg = open_message(got.body)
        except IacError as exc:
            j.put("client.message.signed", False, "MESSAGEs that verify", f"{exc.reason}: {exc}")
            continue
        sender = sender_of(msg)
        ok = sender == h.agent_id and msg.to == me.agent_id
        j.put(
            "client.message.signed",
            ok,
            f"from {h.agent_id[:16]}… to {me.agent_id[:16]}…",
            f"from {sender[:16]}… to {msg.to[:16]}…",
        )
        j.put(
            "client.message.after_hello", True, "MESSAGEs after the handshake", "MESSAGEs after the handshake"
        )
        if int(msg.msg_type) in (MessageType.REPLY, MessageType.ERROR, MessageType.ACK, MessageType.CANCEL):
            continue
        if msg.deadline:
            payload = "null" if int(msg.msg_type) == MessageType.PING else (msg.payload_json or "null")
            await answerer.answer(msg, MessageType.REPLY, payload)
        elif msg.flags & FLAG_ACK_REQUESTED:
            await answerer.answer(msg, MessageType.ACK, "")


async def run_client_suite(
    url: str,
    identity: Identity,
    *,
    connections: int = 1,
    wait: float = DEFAULT_WAIT,
    timeout: float = DEFAULT_TIMEOUT,
    announce: Callable[[str], None] = print,
    on_result: Callable[[CaseResult], None] | None = None,
    refusals: bool = False,
) -> Report:
    """Listen at ``url``; judge the next ``connections`` connections, each within ``wait`` seconds."""
    queue: asyncio.Queue[Link] = asyncio.Queue()

    taken = 0

    async def on_link(link: Link) -> None:
        nonlocal taken
        if taken >= connections:  # more dialers than the run judges: not held open
            link.close()
            return
        taken += 1
        queue.put_nowait(link)

    server = Server(url, generate_self_signed(identity.agent_id), on_link)
    address = await server.start()
    announce(f"tester {identity.agent_id}")
    announce(f"listening {address}")
    report = Report(address, "client")
    try:
        for n in range(1, connections + 1):
            t0 = time.monotonic()
            try:
                link = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                j = _Judge()
                j.put("client.connect", False, "a connection", f"no connection in {wait:g} s")
            else:
                if refusals and n <= len(REFUSALS):
                    j = await refuse_connection(link, identity, REFUSALS[n - 1], timeout)
                else:
                    j = await judge_connection(link, identity, timeout, wait)
            report.reached = report.reached or j.hello_seen
            for cid, (section, quote) in ALL_CLIENT_CASES.items():
                out = j.outcomes.get(cid)
                if out is None:
                    continue
                seen = out.seen if connections == 1 else f"connection {n}: {out.seen}"
                result = CaseResult(
                    cid, section, quote, out.passed, out.expected, seen, round(time.monotonic() - t0, 3)
                )
                report.results.append(result)
                if on_result is not None:
                    on_result(result)
    finally:
        server.close()
    return report


__all__ = [
    "ALL_CLIENT_CASES",
    "CLIENT_CASES",
    "DEFAULT_WAIT",
    "REFUSALS",
    "judge_connection",
    "run_client_suite",
]
