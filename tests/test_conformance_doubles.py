"""Every case of the tester fails, naming itself, against a double that breaks its rule.

Server role: a UNIX proxy in front of a real ``iac node`` passes the tester's bytes through
unchanged and breaks one rule in what the node sends back, re-signing with the node's key where
the broken rule needs a valid signature (a HELLO naming another peer, a REPLY with another
payload). Against the unbroken proxy every case passes, so each failure below is the broken
rule's. Client role: a raw client built from the tester's own pieces dials the listening tester
with one thing wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run

from iac.conformance import all_cases, run_server_suite
from iac.conformance.link import Ended, Link, Server, dial
from iac.conformance.listen import CLIENT_CASES, REFUSALS, run_client_suite
from iac.conformance.peer import HelloSeen, Peer, make_hello, read_hello
from iac.errors import CloseCode
from iac.protocol.clock import now_us
from iac.protocol.handshake import Role, decode_goaway, encode_goaway
from iac.transport.certs import generate_self_signed
from iac.transport.quic.backend import get_backend
from iac.transport.quic.reset import build_reset
from iac.wire._pb.iac_pb2 import Dict, Hello, Message
from iac.wire.dicts import DictionarySet
from iac.wire.enums import MessageType
from iac.wire.frames import Frame, FrameDecoder, FrameType, PackedFrame, encode_frame
from iac.wire.identity import Domain, Identity
from iac.wire.message import Session, build_message, open_hello, open_message, sign_hello
from iac.wire.message import sign_message as sign

ENV_DIR = tempfile.mkdtemp(prefix="iac-run-")
NO_DICT = DictionarySet().require(0)


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[str, Identity]]:
    d = Path(tempfile.mkdtemp(prefix="iac-dbl-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": ENV_DIR}
    subprocess.run(
        [sys.executable, "-m", "iac", "keygen", "--out", str(d / "n.key")],
        check=True,
        env=env,
        capture_output=True,
    )
    sock = d / "run" / "node.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iac", "node", "--key", str(d / "n.key"), "--listen", f"unix://{sock}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("node ")
        assert proc.stdout.readline().startswith("listening ")
        yield str(sock), Identity.load(d / "n.key")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()


# --- the server-role doubles: what the proxy breaks in the node's frames ----------------------------

Mutate = Callable[[Frame, Identity, dict[str, object]], bytes | None]


def _hello(change: Callable[[Hello], None]) -> Mutate:
    def mutate(fr: Frame, key: Identity, state: dict[str, object]) -> bytes | None:
        if fr.type is not FrameType.HELLO:
            return None
        h = open_hello(fr.body, Domain.HELLO_SERVER)
        change(h)
        return encode_frame(FrameType.HELLO, sign_hello(key, h, Domain.HELLO_SERVER))

    return mutate


def _flip_hello_signature(fr: Frame, key: Identity, state: dict[str, object]) -> bytes | None:
    if fr.type is not FrameType.HELLO:
        return None
    return encode_frame(FrameType.HELLO, fr.body[:-1] + bytes([fr.body[-1] ^ 1]))


def _goaway_code(fr: Frame, key: Identity, state: dict[str, object]) -> bytes | None:
    if fr.type is not FrameType.GOAWAY:
        return None
    code, reason = decode_goaway(fr.body)
    return encode_frame(FrameType.GOAWAY, encode_goaway(CloseCode.INTERNAL_ERROR if code else 0, reason))


def _message(change: Callable[[Message, dict[str, object]], bool]) -> Mutate:
    """Re-sign a MESSAGE that ``change`` changed (it returns False to drop the message)."""

    def mutate(fr: Frame, key: Identity, state: dict[str, object]) -> bytes | None:
        if fr.type is not FrameType.MESSAGE:
            return None
        msg = open_message(fr.body)
        if not change(msg, state):
            return b""
        return encode_frame(FrameType.MESSAGE, sign(key, msg))

    return mutate


def _error_internal(msg: Message, state: dict[str, object]) -> bool:
    if msg.msg_type == MessageType.ERROR:
        msg.payload_json = json.dumps({"code": "internal", "message": "broken double"})
    return True


def _error_other_ids(msg: Message, state: dict[str, object]) -> bool:
    if msg.msg_type == MessageType.ERROR:
        msg.reply_to += 1
    return True


def _reply_one(msg: Message, state: dict[str, object]) -> bool:
    if msg.msg_type == MessageType.REPLY:
        msg.payload_json = "1"
    return True


def _drop_ack(msg: Message, state: dict[str, object]) -> bool:
    return msg.msg_type != MessageType.ACK


def _fresh_answer_ids(msg: Message, state: dict[str, object]) -> bool:
    """A duplicate's answer made anew (another msg_id) instead of the cached one."""
    key = (msg.reply_session_id, msg.reply_to)
    seen = state.setdefault("answered", set())
    assert isinstance(seen, set)
    if key in seen:
        msg.msg_id += 1000
    seen.add(key)
    return True


BREAKS: dict[str, Mutate] = {
    "hello_signature": _flip_hello_signature,
    "hello_names_someone": _hello(lambda h: setattr(h, "peer_agent_id", Identity.generate().agent_id)),
    "hello_echoes": _hello(lambda h: setattr(h, "peer_nonce", b"\x07" * 16)),
    "hello_bound": _hello(lambda h: setattr(h, "channel_binding", b"\x01" * 32)),
    "hello_old": _hello(lambda h: setattr(h, "timestamp", h.timestamp - 3_600_000_000)),
    "hello_version": _hello(lambda h: setattr(h, "version", 2)),
    "hello_capability": _hello(lambda h: h.capabilities.append("Stream-1")),
    "close_code": _goaway_code,
    "error_code": _message(_error_internal),
    "error_ids": _message(_error_other_ids),
    "reply_payload": _message(_reply_one),
    "no_ack": _message(_drop_ack),
    "fresh_answer": _message(_fresh_answer_ids),
    "hello_compressed": lambda fr, key, state: (
        bytes((FrameType.HELLO, 1)) + _varint(len(z := NO_DICT.compress(fr.body))) + z
        if fr.type is FrameType.HELLO
        else None
    ),
}

#: What the proxy does with a frame the tester sent: "pass", "drop" it, or "refuse" it (GOAWAY and
#: close, as a node that refuses what it must take).
UpFilter = Callable[[PackedFrame, dict[str, object]], str]


def _old_ids(p: PackedFrame, state: dict[str, object]) -> str:
    """A replay window of 1000 ids instead of at least 1024."""
    if p.type is not FrameType.MESSAGE or p.dict_id is not None:
        return "pass"
    msg = Message.FromString(p.payload)
    newest = max(int(state.get("newest", 0)), msg.msg_id)  # type: ignore[call-overload]
    state["newest"] = newest
    return "drop" if msg.msg_id + 1000 < newest else "pass"


UP_BREAKS: dict[str, UpFilter] = {
    "refuse_compressed": lambda p, state: (
        "refuse" if p.type is FrameType.MESSAGE and p.dict_id is not None else "pass"
    ),
    "refuse_nonminimal": lambda p, state: (
        "refuse" if p.wire_size > 2 + len(_varint(len(p.payload))) + len(p.payload) else "pass"
    ),
    "small_window": _old_ids,
}

#: What breaks each case's rule (the vector cases by the outcome their row demands).
BROKEN_BY = {
    "hello.signature": "hello_signature",
    "hello.identity": "hello_names_someone",
    "hello.nonce": "hello_echoes",
    "hello.binding": "hello_bound",
    "hello.freshness": "hello_old",
    "hello.fields": "hello_version",
    "frame.nonminimal_length": "refuse_nonminimal",
    "message.window": "small_window",
    "ping.reply": "reply_payload",
    "oneway.ack": "no_ack",
    "message.bad_signature": "error_code",
    "message.stale": "error_code",
    "message.not_addressed": "error_code",
    "message.duplicate": "fresh_answer",
}


def breaker(case_id: str) -> str:
    if case_id in BROKEN_BY:
        return BROKEN_BY[case_id]
    if case_id.startswith("accept."):
        return "refuse_compressed" if case_id.startswith("accept.zstd_") else "error_code"
    if case_id.startswith("vector."):
        v = next(c for c in UNIX_CASES if c.id == case_id)
        return (
            "error_code" if "ERROR" in v.quote.split("|")[-1] and "close |" not in v.quote else "close_code"
        )
    return "close_code"  # hello.refuse.*, message.impersonation


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


class Proxy:
    """tester <-> proxy <-> node on UNIX sockets; tester bytes untouched, node frames mutated.
    ``stop_after_refusal``: once the node refused something, every later connection is dropped
    (a node that stops serving others after a fault)."""

    def __init__(
        self,
        node_path: str,
        key: Identity,
        mutate: Mutate | None,
        stop_after_refusal: bool = False,
        up_filter: UpFilter | None = None,
    ):
        self.node_path, self.key, self.mutate, self.up_filter = node_path, key, mutate, up_filter
        self.stop_after_refusal = stop_after_refusal
        self.refused = False
        self.state: dict[str, object] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self, path: str) -> asyncio.AbstractServer:
        def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.tasks.add(asyncio.get_running_loop().create_task(self._conn(r, w)))

        return await asyncio.start_unix_server(accepted, path)

    async def stop(self, srv: asyncio.AbstractServer) -> None:
        srv.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.refused and self.stop_after_refusal:
            w.close()
            return
        nr, nw = await asyncio.open_unix_connection(self.node_path)

        seen_up = FrameDecoder()

        async def up() -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    if self.up_filter is None:
                        nw.write(data)
                    else:
                        for p in seen_up.feed_packed(data):
                            verdict = self.up_filter(p, self.state)
                            if verdict == "refuse":
                                w.write(
                                    encode_frame(
                                        FrameType.GOAWAY, encode_goaway(CloseCode.PROTOCOL_ERROR, "no")
                                    )
                                )
                                w.close()
                                return
                            if verdict == "pass":
                                flags = 0 if p.dict_id is None else 1
                                nw.write(bytes((p.type, flags)) + _varint(len(p.payload)) + p.payload)
                    await nw.drain()
            with contextlib.suppress(OSError):
                nw.write_eof()

        async def down() -> None:
            dec = FrameDecoder()
            with contextlib.suppress(OSError):
                while data := await nr.read(65536):
                    for fr in dec.feed(data):
                        if fr.type is FrameType.GOAWAY and decode_goaway(fr.body)[0]:
                            self.refused = True
                        out = self.mutate(fr, self.key, self.state) if self.mutate else None
                        w.write(encode_frame(fr.type, fr.body) if out is None else out)
                    await w.drain()
            w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)
        nw.close()


UNIX_CASES = [c for c in all_cases() if "unix" in c.transports]


def _run_through(
    node: tuple[str, Identity],
    ids: list[str],
    mutate: Mutate | None,
    *,
    stop_after_refusal: bool = False,
    up_filter: UpFilter | None = None,
) -> dict[str, bool]:
    path, key = node

    async def main() -> dict[str, bool]:
        d = tempfile.mkdtemp(prefix="iac-px-")
        proxy = Proxy(path, key, mutate, stop_after_refusal, up_filter)
        srv = await proxy.start(f"{d}/p.sock")
        try:
            cases = [c for c in UNIX_CASES if c.id in ids]
            report = await run_server_suite(f"unix://{d}/p.sock", key.agent_id, cases, timeout=2.0)
        finally:
            await proxy.stop(srv)
        assert report.reached
        return {r.id: r.passed for r in report.results}

    result: dict[str, bool] = run(main(), timeout=120)
    return result


def test_the_unbroken_proxy_passes_every_case(node: tuple[str, Identity]) -> None:
    results = _run_through(node, [c.id for c in UNIX_CASES], None)
    assert len(results) == len(UNIX_CASES) and all(results.values()), [k for k, v in results.items() if not v]


#: Further ways to break a case's rule (one case, several rules).
EXTRA_BREAKS = {
    "hello_capability": ["hello.fields"],
    "hello_compressed": ["hello.fields"],
    "error_ids": ["message.bad_signature"],
}


def _broken_by() -> dict[str, list[str]]:
    by_break: dict[str, list[str]] = {}
    for c in UNIX_CASES:
        by_break.setdefault(breaker(c.id), []).append(c.id)
    return {**by_break, **EXTRA_BREAKS}


def test_every_case_has_a_double() -> None:
    by_break = _broken_by()
    assert set(by_break) == set(BREAKS) | set(UP_BREAKS)
    assert {i for ids in by_break.values() for i in ids} == {c.id for c in UNIX_CASES}
    # the cases that need a certificate (TLS, QUIC) or QUIC itself have their doubles below
    others = [c.id for c in all_cases() if "unix" not in c.transports]
    assert sorted(others) == sorted(["hello.refuse.early_message", *QUIC_BREAKS])


def test_early_message_fails_against_a_tls_node_that_takes_anything() -> None:
    """A TLS listener that reads whatever comes first and never refuses it."""
    key = Identity.generate()

    async def main() -> list[tuple[str, bool, str]]:
        async def on_link(link: Link) -> None:
            while not isinstance(await link.events.get(), Ended):
                pass

        server = Server("tls://127.0.0.1:0", generate_self_signed(key.agent_id), on_link)
        url = await server.start()
        try:
            cases = [c for c in all_cases() if c.id == "hello.refuse.early_message"]
            report = await run_server_suite(url, key.agent_id, cases, timeout=0.5)
        finally:
            server.close()
        return [(r.id, r.passed, r.seen) for r in report.results]

    [(cid, passed, seen)] = run(main())
    assert cid == "hello.refuse.early_message" and not passed, seen


@pytest.mark.parametrize("name", sorted([*BREAKS, *UP_BREAKS]))
def test_each_case_fails_against_the_double_that_breaks_its_rule(
    node: tuple[str, Identity], name: str
) -> None:
    """Exactly the cases whose rule the double breaks fail, each naming itself."""
    ids = _broken_by()[name]
    if name in UP_BREAKS:
        results = _run_through(node, ids, None, up_filter=UP_BREAKS[name])
    else:
        results = _run_through(node, ids, BREAKS[name])
    assert results == dict.fromkeys(ids, False), [k for k, v in results.items() if v]


def test_a_node_that_stops_serving_after_a_refusal_fails_the_refusal_cases(
    node: tuple[str, Identity],
) -> None:
    refusals = [c.id for c in UNIX_CASES if breaker(c.id) == "close_code"]
    results = _run_through(node, refusals, None, stop_after_refusal=True)
    assert results == dict.fromkeys(refusals, False)


# --- the client-role doubles: a raw client with one thing wrong ---------------------------------

CLIENT_BREAKS = {
    "client.hello.signature": {"forge": "flip"},
    "client.hello.binding": {"binding": b"\x01" * 32},
    "client.hello.nonce": {"peer_nonce": b"\x02" * 16},
    "client.hello.identity": {"peer_agent_id": "other"},
    "client.hello.freshness": {"timestamp": -3_600_000_000},
    "client.hello.fields": {"version": 2},
    "client.message.signed": {"signer": "other"},
    "client.message.after_hello": {"early": True},
    "client.close": {"close": CloseCode.INTERNAL_ERROR},
    "client.connect": {"silent": True},
}


async def _broken_client(url: str, tester: str, breaks: dict[str, object]) -> None:
    me = Identity.generate()
    link = await dial(url, 5.0)
    peer = Peer(link, me)
    if breaks.get("silent"):
        link.end_sending()
        link.close()
        return

    def forge(h: Hello) -> bytes | None:
        if "version" in breaks:
            h.version = breaks["version"]  # type: ignore[assignment]
        if "timestamp" in breaks:
            h.timestamp += breaks["timestamp"]  # type: ignore[operator]
        if "binding" in breaks:
            h.channel_binding = breaks["binding"]  # type: ignore[assignment]
        if breaks.get("peer_agent_id") == "other":
            h.peer_agent_id = Identity.generate().agent_id
        if "peer_nonce" in breaks:
            h.peer_nonce = breaks["peer_nonce"]  # type: ignore[assignment]
        if breaks.get("forge") == "flip":
            raw = sign_hello(me, h, Domain.HELLO_CLIENT)
            return encode_frame(FrameType.HELLO, raw[:-1] + bytes([raw[-1] ^ 1]))
        return None

    ping = build_message(
        sender=me.agent_id,
        to=tester,
        msg_type=MessageType.PING,
        session=Session(),
        timestamp_us=now_us(),
        deadline_us=now_us() + 5_000_000,
    )
    if breaks.get("early"):
        await peer.send_raw(encode_frame(FrameType.MESSAGE, sign(me, ping)), control=True)
    deadline = time.monotonic() + 5
    server_nonce = b""
    if not link.client_first:
        seen = await read_hello(peer, Role.SERVER, deadline)
        assert isinstance(seen, HelloSeen) and seen.hello is not None
        server_nonce = seen.hello.nonce
    hello = make_hello(
        me,
        Role.CLIENT,
        nonce=secrets.token_bytes(16),
        binding=link.binding,
        peer_nonce=server_nonce,
        peer_agent_id=tester,
        forge=forge,
    )
    await peer.send_raw(hello, control=True)
    if link.client_first:
        await read_hello(peer, Role.SERVER, deadline)
    if breaks.get("signer") == "other":
        other = Identity.generate()
        ping = build_message(
            sender=other.agent_id,
            to=tester,
            msg_type=MessageType.PING,
            session=Session(),
            timestamp_us=now_us(),
            deadline_us=now_us() + 5_000_000,
        )
        await peer.send_raw(encode_frame(FrameType.MESSAGE, sign(other, ping)))
    elif not breaks.get("early"):
        await peer.send_raw(encode_frame(FrameType.MESSAGE, sign(me, ping)))
        await peer.message(deadline, lambda m: m.reply_to == ping.msg_id)
    code = int(breaks.get("close", 0))  # type: ignore[call-overload]
    await peer.send_raw(encode_frame(FrameType.GOAWAY, encode_goaway(code, "bye")), control=True)
    link.close(code)


@pytest.mark.parametrize("case_id", sorted(CLIENT_BREAKS))
def test_each_client_case_fails_against_a_client_that_breaks_it(case_id: str) -> None:
    sock = tempfile.mkdtemp(prefix="iac-cl-")
    tester = Identity.generate()

    async def main() -> dict[str, bool]:
        addr: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def announce(line: str) -> None:
            if line.startswith("listening "):
                addr.set_result(line.split()[1])

        suite = asyncio.ensure_future(
            run_client_suite(f"unix://{sock}/t.sock", tester, wait=5, timeout=2, announce=announce)
        )
        with contextlib.suppress(Exception):  # the tester's refusal may reach the client as an error
            await _broken_client(await addr, tester.agent_id, CLIENT_BREAKS[case_id])
        report = await suite
        return {r.id: r.passed for r in report.results}

    results = run(main(), timeout=30)
    assert results.get(case_id) is False, results
    assert set(CLIENT_BREAKS) == set(CLIENT_CASES)


# --- QUIC doubles: a small QUIC node made of the tester's own pieces, one rule broken ----------------

QUIC_BREAKS = {
    "quic.control_message": "ignores MESSAGEs on the control stream",
    "quic.bidi_stream": "takes a second bidirectional stream",
    "quic.control_fin": "closes on a FIN of the control stream",
    "quic.reset_stream": "closes on a reset stream",
    "quic.control_reset": "closes on a reset of the control stream",
    "quic.parameters": "announces no unidirectional stream at first (grants them once its handshake is done)",
    "quic.dict_unidirectional": "acknowledges DICT on the control stream only",
    "quic.stateless_reset": "drops packets for unknown connection IDs unanswered (as aioquic does)",
    "quic.forged_reset": "takes any reset-shaped datagram for a reset and closes",
    "quic.ack_frequency_bounds": "takes an ACK_FREQUENCY frame whatever its fields",
}


def _stateless_resets(server: Any, broken: str) -> None:
    """Stateless resets on the double's QUIC server (aioquic sends none): a short-header packet
    for an unknown connection ID is answered with a shorter reset (random token: a double need
    not survive a restart), unless ``broken`` says otherwise."""
    lib = get_backend()
    hooks = lib.resets
    assert hooks is not None
    received = server.datagram_received

    def datagram_received(data: bytes, addr: Any) -> None:
        if data and not data[0] & 0x80 and hooks.unknown(server, data) is not None:
            if broken == "quic.forged_reset":
                for proto in hooks.protocols(server):
                    if lib.peer_address(proto._quic) == addr:
                        proto.link.close(0)
            if broken != "quic.stateless_reset":
                reset = build_reset(secrets.token_bytes(16), len(data))
                transport = lib.server_transport(server)
                if reset is not None and transport is not None:
                    transport.sendto(reset, addr)
            return
        received(data, addr)

    server.datagram_received = datagram_received


async def _quic_node(link: Link, me: Identity, broken: str) -> None:
    """Answer the client's HELLO, then every PING request with REPLY null (unless ``broken``)."""
    peer = Peer(link, me)
    decoders: dict[int, FrameDecoder] = {}
    session = Session()
    hello: Hello | None = None

    async def close(code: int) -> None:
        await peer.send_raw(encode_frame(FrameType.GOAWAY, encode_goaway(code, "double")), control=True)
        link.close(code)

    _grant_uni_streams(link)
    if broken == "quic.ack_frequency_bounds":
        _take_any_ack_frequency(link)

    while True:
        ev = await link.events.get()
        if isinstance(ev, Ended):
            return
        if ev.stream % 4 == 0 and ev.stream != 0 and broken != "quic.bidi_stream":
            return await close(CloseCode.PROTOCOL_ERROR)
        if ev.reset:
            decoders.pop(ev.stream, None)
            if broken == ("quic.control_reset" if ev.stream == 0 else "quic.reset_stream"):
                return await close(CloseCode.TRUNCATED_FRAME)
            continue
        if ev.stream == 0 and ev.end and broken == "quic.control_fin":
            return await close(CloseCode.NO_ERROR)
        dec = decoders.setdefault(ev.stream, FrameDecoder())
        for fr in dec.feed(ev.data, final=ev.end and ev.stream != 0):
            if fr.type is FrameType.HELLO and hello is None:
                hello = open_hello(fr.body, Domain.HELLO_CLIENT)
                await peer.send_raw(
                    make_hello(
                        me,
                        Role.SERVER,
                        nonce=secrets.token_bytes(16),
                        binding=link.binding,
                        peer_nonce=hello.nonce,
                        peer_agent_id=hello.agent_id,
                    ),
                    control=True,
                )
            elif fr.type is FrameType.DICT and hello is not None:
                if ev.stream != 0 and broken == "quic.dict_unidirectional":
                    continue
                ack = Dict(dict_id=Dict.FromString(fr.body).dict_id)
                await peer.send_raw(encode_frame(FrameType.DICT_ACK, ack.SerializeToString()), control=True)
            elif fr.type is FrameType.MESSAGE and hello is not None:
                if ev.stream == 0 and broken == "quic.control_message":
                    continue
                msg = open_message(fr.body)
                if msg.deadline:
                    reply = build_message(
                        sender=me.agent_id,
                        to=hello.agent_id,
                        msg_type=MessageType.REPLY,
                        session=session,
                        timestamp_us=now_us(),
                        payload_json="null",
                        reply_to=msg.msg_id,
                        reply_session_id=msg.session_id,
                    )
                    await peer.send_raw(encode_frame(FrameType.MESSAGE, sign(me, reply)))


def _no_uni_streams_at_first(server: Any) -> None:
    """The double's QUIC server announces initial_max_streams_uni 0 (and grants 128 once its
    handshake completed, so that only quic.parameters sees it)."""
    from aioquic.quic.connection import QuicConnection

    init = QuicConnection.__init__

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not self._is_client:
            self._local_max_streams_uni.value = self._local_max_streams_uni.sent = 0

    server.setattr(QuicConnection, "__init__", patched)


def _take_any_ack_frequency(link: Link) -> None:
    """The double's connection reads ACK_FREQUENCY frames (0xaf, four varints) and keeps none
    of their bounds (plain aioquic closes with FRAME_ENCODING_ERROR: a frame it does not know)."""
    from aioquic.quic.connection import EPOCHS

    def take(context: Any, frame_type: int, buf: Any) -> None:
        for _ in range(4):
            buf.pull_uint_var()

    quic = link._quic  # type: ignore[attr-defined]
    quic._QuicConnection__frame_handlers[0xAF] = (take, EPOCHS("01"))


def _grant_uni_streams(link: Link) -> None:
    quic = link._quic  # type: ignore[attr-defined]
    if quic._local_max_streams_uni.value == 0:
        quic._local_max_streams_uni.value = 128
        link._protocol.transmit()  # type: ignore[attr-defined]


def _run_quic_double(broken: str) -> dict[str, bool]:
    me = Identity.generate()

    async def main() -> dict[str, bool]:
        server = Server(
            "quic://127.0.0.1:0", generate_self_signed(me.agent_id), lambda link: _quic_node(link, me, broken)
        )
        url = await server.start()
        _stateless_resets(server.quic_server, broken)
        try:
            cases = [c for c in all_cases() if c.id in QUIC_BREAKS]
            report = await run_server_suite(url, me.agent_id, cases, timeout=2.0)
        finally:
            server.close()
        return {r.id: r.passed for r in report.results}

    with pytest.MonkeyPatch.context() as mp:
        if broken == "quic.parameters":
            _no_uni_streams_at_first(mp)
        result: dict[str, bool] = run(main())
    return result


def test_the_unbroken_quic_double_passes_the_quic_cases() -> None:
    assert _run_quic_double("") == dict.fromkeys(QUIC_BREAKS, True)


@pytest.mark.parametrize("case_id", sorted(QUIC_BREAKS))
def test_each_quic_case_fails_against_the_double_that_breaks_it(case_id: str) -> None:
    results = _run_quic_double(case_id)
    assert results[case_id] is False, (QUIC_BREAKS[case_id], results)
    assert [k for k, v in results.items() if not v] == [case_id]


async def _lax_client(url: str, tester: str) -> None:
    """A client that takes whatever server HELLO comes and closes normally: it refuses nothing."""
    me = Identity.generate()
    link = await dial(url, 5.0)
    peer = Peer(link, me)
    deadline = time.monotonic() + 5
    seen = await read_hello(peer, Role.SERVER, deadline)
    nonce = seen.hello.nonce if isinstance(seen, HelloSeen) and seen.hello is not None else b""
    hello = make_hello(
        me, Role.CLIENT, nonce=secrets.token_bytes(16), binding=b"", peer_nonce=nonce, peer_agent_id=tester
    )
    await peer.send_raw(hello, control=True)
    await peer.send_raw(encode_frame(FrameType.GOAWAY, encode_goaway(0, "bye")), control=True)
    link.close()


def test_every_refusal_case_fails_against_a_client_that_refuses_nothing() -> None:
    sock = tempfile.mkdtemp(prefix="iac-cl-")
    tester = Identity.generate()

    async def main() -> dict[str, bool]:
        addr: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def announce(line: str) -> None:
            if line.startswith("listening "):
                addr.set_result(line.split()[1])

        suite = asyncio.ensure_future(
            run_client_suite(
                f"unix://{sock}/t.sock",
                tester,
                connections=len(REFUSALS),
                wait=5,
                timeout=2,
                announce=announce,
                refusals=True,
            )
        )
        url = await addr
        for _ in REFUSALS:
            await _lax_client(url, tester.agent_id)
        report = await suite
        return {r.id: r.passed for r in report.results}

    assert run(main(), timeout=30) == {r.id: False for r in REFUSALS}
