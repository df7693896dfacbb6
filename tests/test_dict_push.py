"""Per-connection dictionary push (DICT / DICT_ACK): derivation, install, acknowledgement,
refusals, and the bytes it saves. Real sockets on every transport; no sleeps as sync."""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
from pathlib import Path

import pytest
from conftest import TRANSPORT_PARAMS, listen_url, message_of, run

from iac.errors import CloseCode, ConnectionClosed, ProtocolError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.transport import dial, listen
from iac.transport.base import Connection, Incoming, TransportConfig
from iac.transport.session import MAX_PUSHED_DICTS, DictState
from iac.wire._pb.iac_pb2 import Dict, Hello, MessageType
from iac.wire.dicts import (
    DERIVED_ID_MAX,
    DERIVED_ID_MIN,
    MAX_DICT_SIZE,
    ZSTD_DICT_MAGIC,
    DictionarySet,
    default_dictionary,
    derive_dictionary,
    message_prefix,
)
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame

transports = pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
BASE = default_dictionary()
CORPUS = Path(__file__).resolve().parent.parent / "iac" / "bench" / "corpus" / "test.jsonl"


def cfg(**kw: object) -> TransportConfig:
    base: dict[str, object] = {
        "handshake_timeout": 5.0,
        "linger_timeout": 0.5,
        "dictionaries": DictionarySet([BASE]),
        "elide_prefixes": False,  # pushes are what a peer without elide/1 gets (tests/test_elide.py)
    }
    base.update(kw)
    return TransportConfig(**base)  # type: ignore[arg-type]


def payloads(n: int) -> list[str]:
    with CORPUS.open(encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(n), f, strict=False)]


def message(sender: Identity, to: str, session: Session, payload: str, msg_type: int) -> bytes:
    from iac.wire.message import sign_message

    msg = build_message(
        sender=sender.agent_id,
        to=to,
        msg_type=msg_type,
        session=session,
        timestamp_us=0,
        payload_json=payload,
    )
    return sign_message(sender, msg)


def oversized_body() -> bytes:
    big = ZSTD_DICT_MAGIC + (70000).to_bytes(4, "little") + bytes(MAX_DICT_SIZE)
    return Dict(dict_id=70000, sha256=hashlib.sha256(big).digest(), content=big).SerializeToString()


def push_body(d: object) -> bytes:
    from iac.wire.dicts import Dictionary

    assert isinstance(d, Dictionary)
    return Dict(dict_id=d.dict_id, sha256=d.sha256, content=d.content).SerializeToString()


async def wait_acked(conn: Connection) -> None:
    assert conn.dicts is not None
    await asyncio.wait_for(conn.dicts.acked.wait(), 5)


class DictEcho:
    """Answers every MESSAGE with a REPLY compressed with what the connection would use;
    records the dict_id of each received frame."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.connections: list[Connection] = []
        self.dict_ids: list[int | None] = []
        self.conn_ready = asyncio.Event()

    async def __call__(self, conn: Connection) -> None:
        self.connections.append(conn)
        self.conn_ready.set()
        session = Session()
        try:
            while True:
                inc: Incoming = await conn.recv()
                self.dict_ids.append(inc.frame.dict_id)
                if inc.frame.type != FrameType.MESSAGE:
                    continue
                use = conn.send_dictionary or BASE
                msg = build_message(
                    sender=self.identity.agent_id,
                    to=getattr(message_of(inc), "from"),
                    msg_type=MessageType.REPLY,
                    session=session,
                    timestamp_us=0,
                    reply_to=message_of(inc).msg_id,
                    reply_session_id=message_of(inc).session_id,
                    payload_json=message_of(inc).payload_json,
                )
                await conn.send(encode_message_frame(self.identity, msg, compress_with=use))
        except Exception:
            return


# --- sans-IO ------------------------------------------------------------------------------------


def test_derivation_is_deterministic_and_in_range() -> None:
    a, b = Identity.generate(), Identity.generate()
    tail = message_prefix(b.agent_id, a.agent_id) + message_prefix(a.agent_id, b.agent_id)
    d1, d2 = derive_dictionary(BASE, tail), derive_dictionary(BASE, tail)
    assert d1.sha256 == d2.sha256 and d1.dict_id == d2.dict_id
    assert DERIVED_ID_MIN <= d1.dict_id <= DERIVED_ID_MAX
    assert d1.content.endswith(tail) and d1.content[8 : -len(tail)] == BASE.content[8:]
    assert message_prefix(a.agent_id, b.agent_id) == b"\x0a\x40" + a.agent_id.encode() + b"\x12\x40" + (
        b.agent_id.encode()
    )
    assert derive_dictionary(BASE, tail[::-1]).dict_id != d1.dict_id


def test_dict_state_checks() -> None:
    a, b = Identity.generate(), Identity.generate()
    sent: list[bytes] = []
    state = DictState(cfg(), sent.append)
    hello = Hello(agent_id=a.agent_id, dict_ids=[BASE.dict_id])
    frame = state.push_frame(b.agent_id, hello)
    assert frame is not None and frame[0] == FrameType.DICT and len(frame) < 1024
    assert state.pushed is not None and state.send_dictionary is None
    with pytest.raises(ProtocolError) as exc_info:  # an ACK for something else
        state.on_ack(Dict(dict_id=1, sha256=b"x" * 32).SerializeToString())
    assert exc_info.value.reason == "bad_dictionary"
    state.on_ack(Dict(dict_id=state.pushed.dict_id, sha256=state.pushed.sha256).SerializeToString())
    assert state.send_dictionary is state.pushed and state.acked.is_set()

    derived = [derive_dictionary(BASE, bytes([i]) * 40) for i in range(MAX_PUSHED_DICTS + 1)]
    for d in derived[:MAX_PUSHED_DICTS]:
        state.on_dict(push_body(d))
        assert d.dict_id in state.decode
    state.on_dict(push_body(derived[0]))  # the same one again: acknowledged, not counted
    assert len(sent) == MAX_PUSHED_DICTS + 1 and all(f[0] == FrameType.DICT_ACK for f in sent)
    with pytest.raises(ProtocolError, match="more than") as exc_info:
        state.on_dict(push_body(derived[-1]))
    assert exc_info.value.reason == "bad_dictionary"
    fresh = DictState(cfg(), sent.append)
    d = derived[0]
    with pytest.raises(ProtocolError, match="sha256") as exc_info:
        fresh.on_dict(Dict(dict_id=d.dict_id, sha256=bytes(32), content=d.content).SerializeToString())
    assert exc_info.value.reason == "bad_dictionary"
    with pytest.raises(ProtocolError, match="its content has id") as exc_info:
        fresh.on_dict(Dict(dict_id=d.dict_id + 1, sha256=d.sha256, content=d.content).SerializeToString())
    assert exc_info.value.reason == "bad_dictionary"
    junk = b"not a dictionary"
    with pytest.raises(ProtocolError) as exc_info:
        fresh.on_dict(Dict(dict_id=1, sha256=hashlib.sha256(junk).digest(), content=junk).SerializeToString())
    assert exc_info.value.reason == "bad_dictionary"
    with pytest.raises(ProtocolError, match="above") as exc_info:
        fresh.on_dict(oversized_body())
    assert exc_info.value.reason == "bad_dictionary"
    assert BASE.dict_id in fresh.decode and len(fresh.decode) == 1
    assert BASE.dict_id in cfg().dictionaries and len(cfg().dictionaries) == 1  # global set untouched

    off = DictState(cfg(push_dictionaries=False), sent.append)
    assert off.push_frame(b.agent_id, hello) is None
    off.on_dict(Dict(dict_id=1, sha256=bytes(32)).SerializeToString())  # ignored, like before
    assert DictState(cfg(), sent.append).push_frame(b.agent_id, Hello(agent_id=a.agent_id)) is None


def test_reconnects_reuse_the_derived_and_installed_dictionaries() -> None:
    a, b = Identity.generate(), Identity.generate()
    hello = Hello(agent_id=a.agent_id, dict_ids=[BASE.dict_id])
    first, second = DictState(cfg()), DictState(cfg())
    f1, f2 = first.push_frame(b.agent_id, hello), second.push_frame(b.agent_id, hello)
    assert f1 == f2 and first.pushed is second.pushed  # derived and compressed once
    assert DictState(cfg()).push_frame(a.agent_id, Hello(agent_id=b.agent_id, dict_ids=[BASE.dict_id])) != f1
    d = derive_dictionary(BASE, b"reuse" * 20)
    r1, r2 = DictState(cfg()), DictState(cfg())
    r1.on_dict(push_body(d))
    r2.on_dict(push_body(d))
    assert r1.decode.get(d.dict_id) is r2.decode.get(d.dict_id)  # loaded once, by its SHA-256
    assert r1.installed == r2.installed == [r1.decode.get(d.dict_id)]  # still counted per connection


# --- real connections ---------------------------------------------------------------------------


@transports
def test_both_sides_switch_to_the_derived_dictionary(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()
    texts = payloads(40)

    async def main() -> None:
        echo = DictEcho(server)
        async with await listen(listen_url(transport, sockdir), server, echo, config=cfg()) as listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=cfg())
            await asyncio.wait_for(echo.conn_ready.wait(), 5)
            sconn = echo.connections[0]
            await wait_acked(conn)
            await wait_acked(sconn)
            mine, theirs = conn.send_dictionary, sconn.send_dictionary
            assert mine is not None and theirs is not None and mine.dict_id != theirs.dict_id
            assert DERIVED_ID_MIN <= mine.dict_id <= DERIVED_ID_MAX
            # each side decodes the other's push, on this connection only
            assert conn.dicts is not None and theirs.dict_id in conn.dicts.decode
            assert mine.dict_id not in conn.dicts.decode
            before, after = [], []
            session = Session()
            for text in texts:
                body = message(client, server.agent_id, session, text, MessageType.PING)
                before.append(len(encode_frame(FrameType.MESSAGE, body, compress_with=BASE)))
                frame = encode_frame(FrameType.MESSAGE, body, compress_with=mine)
                after.append(len(frame))
                await conn.send(frame)
                inc = await conn.recv()
                assert message_of(inc) is not None and message_of(inc).payload_json == text
                assert inc.frame.dict_id == theirs.dict_id
            assert set(echo.dict_ids) == {mine.dict_id}
            assert statistics.mean(after) < statistics.mean(before) - 40
            await conn.close()

    run(main())


@transports
@pytest.mark.parametrize("fault", ["bad_sha", "oversized", "too_many", "stray_ack"])
def test_bad_push_closes_only_that_connection(transport: str, fault: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        echo = DictEcho(server)
        async with await listen(listen_url(transport, sockdir), server, echo, config=cfg()) as listener:
            good = await dial(listener.addresses[0], client, expect=server.agent_id, config=cfg())
            await asyncio.wait_for(echo.conn_ready.wait(), 5)
            await wait_acked(good)
            # the bad client neither pushes nor reads ACKs: only its crafted frames count
            bad = await dial(
                listener.addresses[0], client, expect=server.agent_id, config=cfg(push_dictionaries=False)
            )
            d = derive_dictionary(BASE, b"x" * 64)
            if fault == "bad_sha":
                body = Dict(dict_id=d.dict_id, sha256=bytes(32), content=d.content).SerializeToString()
                await bad.send(encode_frame(FrameType.DICT, body, compress_with=BASE))
            elif fault == "oversized":
                await bad.send(encode_frame(FrameType.DICT, oversized_body(), plain_zstd=True))
            elif fault == "too_many":
                for i in range(MAX_PUSHED_DICTS + 1):
                    body = push_body(derive_dictionary(BASE, bytes([i]) * 64))
                    await bad.send(encode_frame(FrameType.DICT, body, compress_with=BASE))
            else:
                body = Dict(dict_id=d.dict_id, sha256=d.sha256).SerializeToString()
                await bad.send(encode_frame(FrameType.DICT_ACK, body))
            with pytest.raises(ConnectionClosed) as info:
                await bad.recv()
            assert info.value.code == CloseCode.BAD_DICTIONARY
            sbad = next(c for c in echo.connections if c is not echo.connections[0])
            await asyncio.wait_for(sbad.wait_closed(), 5)
            err = sbad.close_error
            assert (
                err is not None
                and isinstance(err.__cause__, ProtocolError)
                and err.__cause__.reason == "bad_dictionary"
            )
            # the other connection goes on, with its derived dictionary
            session = Session()
            for text in payloads(3):
                await good.send(
                    encode_frame(
                        FrameType.MESSAGE,
                        message(client, server.agent_id, session, text, MessageType.PING),
                        compress_with=good.send_dictionary,
                    )
                )
                inc = await good.recv()
                assert message_of(inc) is not None and message_of(inc).payload_json == text
            await good.close()

    run(main())


@transports
def test_push_disabled_uses_the_hello_dictionary(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        echo = DictEcho(server)
        async with await listen(listen_url(transport, sockdir), server, echo, config=cfg()) as listener:
            conn = await dial(
                listener.addresses[0], client, expect=server.agent_id, config=cfg(push_dictionaries=False)
            )
            session = Session()
            for text in payloads(4):
                body = message(client, server.agent_id, session, text, MessageType.PING)
                await conn.send(encode_frame(FrameType.MESSAGE, body, compress_with=BASE))
                inc = await conn.recv()
                assert message_of(inc) is not None and inc.frame.dict_id == BASE.dict_id
            sconn = echo.connections[0]
            # the server pushed, but this side never acknowledged: nobody switched
            assert sconn.dicts is not None and sconn.dicts.pushed is not None
            assert sconn.send_dictionary is None and conn.send_dictionary is None
            assert conn.dicts is not None and conn.dicts.pushed is None and len(conn.dicts.decode) == 1
            assert set(echo.dict_ids) == {BASE.dict_id}
            await conn.close()

    run(main())


@pytest.mark.parametrize("transport", ["tls", "unix", "quic"])
def test_node_bytes_per_message_drop(transport: str, sockdir: Path) -> None:
    texts = payloads(60)

    async def measure(push: bool, name: str) -> float:
        url = f"unix://{sockdir}/run/{name}.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"
        conf = NodeConfig(transport=cfg(push_dictionaries=push))
        async with Node(listen=[url], config=conf) as bob, Node(config=conf) as alice:
            alice.add_peer(bob.agent_id, *bob.addresses)

            @bob.on(MessageType.RUN)
            async def echo(ctx: object) -> object:
                return {"ok": True}

            await alice.connect(bob.agent_id)
            conn = alice.connection(bob.agent_id)
            assert conn is not None
            if push:
                await wait_acked(conn)
            start = alice.stats().bytes_sent
            for text in texts:
                await alice.request(bob.agent_id, MessageType.RUN, json.loads(text), timeout=5)
            sent = alice.stats().bytes_sent - start
            assert (conn.send_dictionary is not None) == push
            return sent / len(texts)

    async def main() -> None:
        with_push = await measure(True, "a")
        without = await measure(False, "b")
        assert with_push < without - 40, (with_push, without)

    run(main())
