"""The cases the tester runs against a node it dials: each an id, the section of
docs/PROTOCOL.md it checks, the sentence quoted, and a coroutine that returns what it saw.

The negative frames are the bytes of ``proto/testvectors/v1.json`` (``negative``), read from
the file (:mod:`iac.conformance.vectors`), never rebuilt here.
"""

from __future__ import annotations

from collections.abc import Callable

from iac.conformance import link as links
from iac.conformance.peer import Closed, Dialed, NoAnswer, Peer, answers, make_hello
from iac.conformance.target import (
    CASES,
    Failed,
    Outcome,
    Target,
    capability_faults,
    case,
    check,
    describe,
    error_code,
)
from iac.errors import CloseCode
from iac.protocol.clock import now_us
from iac.protocol.handshake import NONCE_SIZE, PROTOCOL_VERSION, Role
from iac.wire._pb.iac_pb2 import Hello, Message
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ACK_REQUESTED, sign_hello, sign_message

# --- the node's HELLO -----------------------------------------------------------------------------


async def _server_hello(t: Target) -> tuple[Dialed, Hello]:
    d = await t.first()
    if d.closed is not None:
        raise Failed(f"no HELLO: {d.closed.describe()}")
    assert d.server is not None
    if d.server.hello is None:
        raise Failed(f"the node's HELLO does not open: {d.server.error}")
    return d, d.server.hello


@case(
    "hello.signature",
    "6 HELLO",
    "A HELLO is signed like a Message (section 3) with field 15 in place of "
    "field 8, in the domain of its sender's role",
)
async def _hello_signature(t: Target) -> Outcome:
    d = await t.first()
    if d.closed is not None:
        raise Failed(f"no HELLO: {d.closed.describe()}")
    assert d.server is not None
    return check(
        "a HELLO that verifies in iac-hello-server-v1",
        d.server.error or "a HELLO that verifies in iac-hello-server-v1",
    )


@case("hello.identity", "6 Roles and orders", "whose `peer_agent_id` names the client")
async def _hello_identity(t: Target) -> Outcome:
    d, h = await _server_hello(t)
    want_peer = t.identity.agent_id if d.peer.link.client_first else ""
    expected = f"agent_id {t.to[:16]}…, peer_agent_id {want_peer[:16] or '(empty)'}"
    return check(expected, f"agent_id {h.agent_id[:16]}…, peer_agent_id {h.peer_agent_id[:16] or '(empty)'}")


@case(
    "hello.nonce",
    "6 Roles and orders",
    "The server checks it and answers with its own HELLO, whose `peer_nonce` echoes the client's nonce",
)
async def _hello_nonce(t: Target) -> Outcome:
    d, h = await _server_hello(t)
    echo = d.nonce.hex() if d.peer.link.client_first else "(empty)"
    return check(
        f"nonce of {NONCE_SIZE} bytes, peer_nonce {echo}",
        f"nonce of {len(h.nonce)} bytes, peer_nonce {h.peer_nonce.hex() or '(empty)'}",
    )


@case(
    "hello.binding",
    "6 HELLO",
    "`channel_binding` | SHA-256 of the server's certificate (DER) as the "
    "sender saw it; empty on UNIX sockets",
)
async def _hello_binding(t: Target) -> Outcome:
    d, h = await _server_hello(t)
    return check(d.peer.link.binding.hex() or "(empty)", h.channel_binding.hex() or "(empty)")


@case("hello.freshness", "6 Checks on a received HELLO", "`|now − timestamp| ≤ max_skew`: else `stale_hello`")
async def _hello_fresh(t: Target) -> Outcome:
    d, h = await _server_hello(t)
    assert d.server is not None
    skew = (h.timestamp - d.server.received_us) / 1e6
    return Outcome(abs(skew) <= 60, "timestamp within 60 s of the tester's clock", f"{skew:+.3f} s")


@case(
    "hello.fields",
    "6 HELLO",
    "`version` | 1; `max_frame_size` | the largest frame the sender accepts, at least 1024; 0 = not "
    "announced. (4) HELLO frames MUST be sent raw. (18 Capabilities) A sender MUST NOT announce an entry "
    "of another form, nor one twice, nor more than 64",
)
async def _hello_fields(t: Target) -> Outcome:
    d, h = await _server_hello(t)
    assert d.server is not None
    ok = h.version == PROTOCOL_VERSION and (h.max_frame_size == 0 or h.max_frame_size >= 1024)
    caps = capability_faults(h.capabilities)
    raw = "raw" if not d.server.compressed else "compressed"
    return Outcome(
        ok and not caps and not d.server.compressed,
        "a raw HELLO frame, version 1, max_frame_size 0 or ≥ 1024, capabilities of the form name/version",
        f"a {raw} HELLO frame, version {h.version}, max_frame_size {h.max_frame_size}, "
        f"capabilities {list(h.capabilities)}" + (f" ({caps})" if caps else ""),
    )


# --- refused HELLOs -----------------------------------------------------------------------------


async def _refused(t: Target, expected: int, **kw: object) -> Outcome:
    want = f"close 0x{expected:02x} {CloseCode(expected).name.lower()}, then other connections served"
    d = await t.dial(**kw)  # type: ignore[arg-type]
    try:
        closed = d.closed or await d.peer.close_seen(t.deadline())
    except NoAnswer:
        closed = None
    finally:
        d.peer.link.close()
    seen = "the connection stayed open" if closed is None else closed.describe()
    ok = closed is not None and closed.code == expected
    if ok:
        served = await t.serves()
        if served:
            return Outcome(False, want, f"{seen}; then {served}")
        seen += ", then other connections served"
    return Outcome(ok, want, seen)


def _flip_signature(identity: Identity) -> Callable[[Hello], bytes]:
    def forge(h: Hello) -> bytes:
        raw = sign_hello(identity, h, Role.CLIENT.domain)
        return encode_frame(FrameType.HELLO, raw[:-1] + bytes([raw[-1] ^ 1]))

    return forge


@case(
    "hello.refuse.signature",
    "6 Checks on a received HELLO",
    "`agent_id` is an AgentId (else `invalid_agent_id`) and the signature verifies by it in the sender "
    "role's domain (else `bad_signature`): either refusal closes with `0x11 BAD_HELLO_SIGNATURE`",
)
async def _hello_bad_sig(t: Target) -> Outcome:
    me = Identity.generate()
    return await _refused(t, CloseCode.BAD_HELLO_SIGNATURE, identity=me, forge=_flip_signature(me))


def _set(**fields: object) -> Callable[[Hello], None]:
    def forge(h: Hello) -> None:
        for k, v in fields.items():
            setattr(h, k, v)

    return forge


@case(
    "hello.refuse.stale",
    "6 Checks on a received HELLO",
    "`|now − timestamp| ≤ max_skew`: else `stale_hello` (0x13)",
)
async def _hello_stale(t: Target) -> Outcome:
    return await _refused(t, CloseCode.STALE_HELLO, forge=_set(timestamp=now_us() - 3_600_000_000))


@case(
    "hello.refuse.version", "6 Checks on a received HELLO", "`version` is 1: else `handshake_failed` (0x10)"
)
async def _hello_version(t: Target) -> Outcome:
    return await _refused(t, CloseCode.HANDSHAKE_FAILED, forge=_set(version=2))


@case(
    "hello.refuse.nonce_size",
    "6 Checks on a received HELLO",
    "`nonce` is 16 bytes: else `handshake_failed` (0x10)",
)
async def _hello_nonce_size(t: Target) -> Outcome:
    return await _refused(t, CloseCode.HANDSHAKE_FAILED, forge=_set(nonce=b"\x01" * 15))


@case(
    "hello.refuse.frame_size",
    "6 Checks on a received HELLO",
    "`max_frame_size` is 0 or at least 1024: else `handshake_failed` (0x10)",
)
async def _hello_frame_size(t: Target) -> Outcome:
    return await _refused(t, CloseCode.HANDSHAKE_FAILED, forge=_set(max_frame_size=1023))


@case(
    "hello.refuse.binding",
    "6 Checks on a received HELLO",
    "`channel_binding` equals this connection's "
    "binding (section 7; empty on UNIX), compared in constant time: else `channel_binding_mismatch` (0x15)",
)
async def _hello_binding_bad(t: Target) -> Outcome:
    bad = b"\x00" * 32 if t.transport != "unix" else b"\x01" * 32
    return await _refused(t, CloseCode.CHANNEL_BINDING, forge=_set(channel_binding=bad))


@case(
    "hello.refuse.wrong_peer",
    "6 Checks on a received HELLO",
    "`peer_agent_id`, when set, names this node (0x12)",
)
async def _hello_wrong_peer(t: Target) -> Outcome:
    return await _refused(t, CloseCode.WRONG_PEER, forge=_set(peer_agent_id=Identity.generate().agent_id))


@case(
    "hello.refuse.replay",
    "6 Checks on a received HELLO",
    "last the nonce is unseen in the nonce cache (0x14, below), which records it",
)
async def _hello_replay(t: Target) -> Outcome:
    d = await t.first()
    if not d.sent:
        raise Failed("no HELLO was accepted to replay")
    return await _refused(t, CloseCode.REPLAYED_HELLO, replay=d.sent)


@case(
    "hello.refuse.second",
    "6 Checks on a received HELLO",
    "A second HELLO on a connection is `unexpected_hello` (0x17)",
)
async def _hello_second(t: Target) -> Outcome:
    peer = await t.session()
    binding = peer.link.binding
    await peer.send_raw(
        make_hello(peer.identity, Role.CLIENT, nonce=b"\x02" * 16, binding=binding), control=True
    )
    return await closed_with(t, peer, CloseCode.UNEXPECTED_HELLO)


@case(
    "hello.refuse.early_message",
    "6 Roles and orders",
    "During the exchange the only frames allowed on "
    "the control stream (the connection, on TLS/TCP and UNIX) are HELLO and GOAWAY; any other frame there "
    "is `handshake_failed`",
    ("quic", "tls"),
)
async def _early_message(t: Target) -> Outcome:
    me = Identity.generate()

    def forge(h: Hello) -> bytes:
        msg = Peer(links.Link(), me).build(t.to, MessageType.PING)
        return encode_frame(FrameType.MESSAGE, sign_message(me, msg))

    return await _refused(t, CloseCode.HANDSHAKE_FAILED, identity=me, forge=forge)


async def closed_with(t: Target, peer: Peer, code: int, *, plain_end_ok: bool = False) -> Outcome:
    """The connection closed with ``code`` and another connection is served after. ``plain_end_ok``:
    the tester ended its side of a TLS connection (TLS has no half-close, so the node's GOAWAY
    cannot reach it): the end of the connection is all there is to see."""
    want = f"close 0x{code:02x} {CloseCode(code).name.lower()}, then other connections served"
    if plain_end_ok:
        want = f"close 0x{code:02x} or the end of the connection (TLS: no half-close), then other connections"
        want += " served"
    try:
        closed = await peer.close_seen(t.deadline())
    except NoAnswer:
        peer.link.close()
        return Outcome(False, want, f"no close in {t.timeout:g} s")
    peer.link.close()
    if closed.code != code and not (plain_end_ok and closed.code is None):
        return Outcome(False, want, closed.describe())
    served = await t.serves()
    return Outcome(
        not served,
        want,
        closed.describe() + (f"; then {served}" if served else ", then other connections served"),
    )


# --- messages -----------------------------------------------------------------------------------


@case(
    "ping.reply",
    "11 Answers",
    "a node MUST answer a PING request (`deadline` ≠ 0) with REPLY `null` (`payload_json` = `null`)",
)
async def _ping(t: Target) -> Outcome:
    peer = await t.session()
    _req, got = await peer.request(t.to, MessageType.PING, t.deadline())
    if isinstance(got, Closed):
        return Outcome(False, "REPLY null", got.describe())
    ok = (
        int(got.msg_type) == MessageType.REPLY
        and got.payload_json in ("null", "")
        and getattr(got, "from") == t.to
    )
    return Outcome(ok, "REPLY null from the node, naming the PING", describe(got))


@case(
    "oneway.ack",
    "11 Answers",
    "**ACK** (12) acknowledges a one-way ACK_REQUESTED message once its handler finished",
)
async def _oneway_ack(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, flags=FLAG_ACK_REQUESTED)
    await peer.send_message(msg)

    got = await peer.message(t.deadline(), lambda m: answers(m, msg))
    return check("ACK", describe(got).split(" ")[0] if isinstance(got, Message) else describe(got))


@case(
    "message.bad_signature",
    "8 What each fault costs",
    "`from` not a valid AgentId, or bad signature, in a "
    "MESSAGE frame | refuse, count `bad_signature`, charge the peer's verify budget; the connection goes on "
    "| ERROR `bad_signature` to the HELLO-proved peer",
)
async def _msg_bad_sig(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    body = sign_message(peer.identity, msg)
    await peer.send_raw(encode_frame(FrameType.MESSAGE, body[:-1] + bytes([body[-1] ^ 1])))
    got = await peer.message(t.deadline(), lambda m: int(m.msg_type) == MessageType.ERROR)
    first = describe(got)
    if isinstance(got, Message):
        named = got.to == peer.identity.agent_id and answers(got, msg)
        first = f"ERROR {error_code(got)}" + (
            " naming the message's ids" if named else " naming other ids or peer"
        )
    _, after = await peer.request(t.to, MessageType.PING, t.deadline())
    return check(
        "ERROR bad_signature naming the message's ids; the same connection then answers a PING",
        first
        + (
            "; the same connection then answers a PING"
            if isinstance(after, Message) and int(after.msg_type) == MessageType.REPLY
            else f"; then {describe(after)}"
        ),
    )


@case(
    "message.stale",
    "8 What each fault costs",
    "stale or future timestamp | refuse, count `stale_message` | ERROR `bad_request`",
)
async def _msg_stale(t: Target) -> Outcome:
    peer = await t.session()
    _, got = await peer.request(t.to, MessageType.PING, t.deadline(), timestamp_us=now_us() - 600_000_000)
    return check(
        "ERROR bad_request",
        f"ERROR {error_code(got)}"
        if isinstance(got, Message) and int(got.msg_type) == MessageType.ERROR
        else describe(got),
    )


@case(
    "message.duplicate",
    "8 What each fault costs",
    "duplicate of a message already handled | count "
    "`duplicate`; send its answer again (the cached REPLY or ERROR, else the ACK when ACK_REQUESTED)",
)
async def _msg_dup(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    frame = await peer.send_message(msg)

    first = await peer.message(t.deadline(), lambda m: answers(m, msg))
    await peer.send_raw(frame)
    again = await peer.message(t.deadline(), lambda m: answers(m, msg))
    if isinstance(first, Closed) or isinstance(again, Closed):
        return Outcome(False, "the same REPLY twice", describe(first) + " / " + describe(again))
    same = (first.session_id, first.msg_id) == (again.session_id, again.msg_id)
    return Outcome(
        same and int(first.msg_type) == MessageType.REPLY,
        "the same REPLY twice (same session_id, msg_id)",
        f"{describe(first)} ids {first.session_id:#x}/{first.msg_id}, then ids "
        f"{again.session_id:#x}/{again.msg_id}",
    )


@case(
    "message.not_addressed",
    "8 What each fault costs",
    "MESSAGE frame addressed to another agent or to "
    "nobody | refuse, count `not_addressed` | ERROR `policy_denied`",
)
async def _msg_not_addressed(t: Target) -> Outcome:
    peer = await t.session()
    _, got = await peer.request(Identity.generate().agent_id, MessageType.PING, t.deadline())
    return check(
        "ERROR policy_denied",
        f"ERROR {error_code(got)}"
        if isinstance(got, Message) and int(got.msg_type) == MessageType.ERROR
        else describe(got),
    )


@case(
    "message.impersonation",
    "6 After the handshake",
    "A verified `from` other than the peer that this "
    "connection's HELLO proved closes the connection with `impersonation` (0x18)",
)
async def _msg_impersonation(t: Target) -> Outcome:
    peer = await t.session()
    other = Identity.generate()
    msg = Peer(peer.link, other).build(t.to, MessageType.PING, deadline_s=t.timeout)
    await peer.send_message(msg, signer=other)
    return await closed_with(t, peer, CloseCode.IMPERSONATION)


@case(
    "frame.nonminimal_length",
    "4 Layout and types",
    "Senders SHOULD write it minimally; receivers MUST accept a non-minimal one.",
)
async def _nonminimal(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    body = sign_message(peer.identity, msg)
    n = len(body)
    length = bytes([(n & 0x7F) | 0x80, (n >> 7) | 0x80, 0x00])  # three bytes where one or two do
    await peer.send_raw(bytes([FrameType.MESSAGE, 0]) + length + body)
    got = await peer.message(t.deadline(), lambda m: answers(m, msg))
    return check("REPLY", describe(got).split(" ")[0])


@case(
    "message.window",
    "10 The window",
    "`N` MUST be at least 1024 (default 1024).",
)
async def _window(t: Target) -> Outcome:
    peer = await t.session()
    got = []
    for msg_id in (1100, 1100 - 1023):  # the second is the oldest id a window of 1024 still holds
        msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
        msg.msg_id = msg_id
        await peer.send_message(msg)
        got.append(describe(await peer.message(t.deadline(), lambda m, msg=msg: answers(m, msg))))  # type: ignore[misc]
    return check(
        "REPLY to msg_id 1100, then REPLY to msg_id 77",
        f"{got[0].split(' ')[0]} to msg_id 1100, then {got[1].split(' ')[0]} to msg_id 77",
    )


# --- a second connection of one key (section 6, "Duplicate connections") ---------------------------


def _instance(value: str) -> Callable[[Hello], None]:
    """The HELLO names process ``value`` (in place of the tester's own instance)."""

    def forge(h: Hello) -> None:
        caps = [c for c in h.capabilities if not c.startswith("instance/")]
        del h.capabilities[:]
        h.capabilities.extend([*caps, f"instance/{value}"])

    return forge


async def _pinged(t: Target, peer: Peer) -> str:
    """ "REPLY" when ``peer``'s connection answers a PING, else what it did."""
    try:
        _, got = await peer.request(t.to, MessageType.PING, t.deadline())
    except NoAnswer:
        return f"no answer in {t.timeout:g} s"
    return describe(got).split(" ")[0] if isinstance(got, Message) else describe(got)


async def _second_of_one_key(t: Target, first: str, second: str) -> tuple[Peer, Dialed, str]:
    """Two connections of one fresh key naming instances ``first`` then ``second``; the first is
    confirmed by a PING before the second is dialed."""
    me = Identity.generate()
    d1 = await t.dial(me, forge=_instance(first))
    if d1.closed is not None:
        raise Failed(f"the first connection was refused: {d1.closed.describe()}")
    seen = await _pinged(t, d1.peer)
    if seen != "REPLY":
        raise Failed(f"the first connection's PING: {seen}")
    d2 = await t.dial(me, forge=_instance(second))
    return d1.peer, d2, seen


@case(
    "session.duplicate_identity",
    "6 Duplicate connections",
    "An answer: two live processes hold one key; the new connection is closed with `0x22 "
    "DUPLICATE_IDENTITY` and the old one keeps serving",
)
async def _duplicate_identity(t: Target) -> Outcome:
    old, d2, _ = await _second_of_one_key(t, "0123456789abcdef", "fedcba9876543210")
    try:
        closed = d2.closed or await d2.peer.close_seen(t.deadline())
        seen = closed.describe()
    except NoAnswer:
        closed, seen = None, "the new connection stayed open"
    ok = closed is not None and closed.code == CloseCode.DUPLICATE_IDENTITY
    after = await _pinged(t, old)
    return Outcome(
        ok and after == "REPLY",
        "the new connection closed 0x22 duplicate_identity, the old one answers PING",
        f"the new connection: {seen}; the old one: {after}",
    )


@case(
    "session.replaced",
    "6 Duplicate connections",
    "**The same process, dialed by the same side again**: the dialer gave up on the old connection; "
    "the new one replaces it at once (the old is closed with `0x21 GOING_AWAY`)",
)
async def _replaced(t: Target) -> Outcome:
    old, d2, _ = await _second_of_one_key(t, "00000000000000aa", "00000000000000aa")
    if d2.closed is not None:
        return Outcome(False, "the new connection served", f"the new connection: {d2.closed.describe()}")
    try:
        closed = await old.close_seen(t.deadline())
        seen = closed.describe()
    except NoAnswer:
        closed, seen = None, "the old connection stayed open"
    ok = closed is not None and closed.code == CloseCode.GOING_AWAY
    after = await _pinged(t, d2.peer)
    return Outcome(
        ok and after == "REPLY",
        "the old connection closed 0x21 going_away, the new one answers PING",
        f"the old connection: {seen}; the new one: {after}",
    )


__all__ = ["CASES", "closed_with"]
