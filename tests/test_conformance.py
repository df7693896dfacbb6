"""One conformance suite, every transport: the same checks over quic, tls and unix.

Real sockets on 127.0.0.1 (UNIX: a private temp dir), real certificates, real
processes where it matters. No sleeps for synchronisation.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    TRANSPORT_PARAMS,
    EchoNode,
    listen_url,
    message_of,
    ping_frame,
    reply_frame,
    roundtrip,
    run,
    settle,
)

from iac.errors import CloseCode, ConnectionClosed, HandshakeError, TransportError
from iac.protocol.handshake import ALPN, HelloDraft
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
from iac.transport.certs import CertAuthority, generate_self_signed, init_ca
from iac.wire.identity import Identity
from iac.wire.message import Session, sign_hello

transports = pytest.mark.parametrize("transport", TRANSPORT_PARAMS)

FAST = TransportConfig(handshake_timeout=5.0, linger_timeout=0.5)


def cfg(**kw: object) -> TransportConfig:
    base = {"handshake_timeout": 5.0, "linger_timeout": 0.5}
    base.update(kw)
    return TransportConfig(**base)  # type: ignore[arg-type]


async def start(transport: str, sockdir: Path, server: Identity, config: TransportConfig = FAST):
    node = EchoNode(server)
    listener = await listen(listen_url(transport, sockdir), server, node, config=config)
    return node, listener


async def dial_and_use(
    url: str, me: Identity, expect: str | None, config: TransportConfig = FAST
) -> Connection:
    """Dial, then one request/reply. On UNIX the server judges the client's HELLO
    after ``dial`` returned, so a refusal surfaces at the first ``recv``."""
    conn = await dial(url, me, expect=expect, config=config)
    try:
        await roundtrip(conn, me)
    except BaseException:
        await conn.close()
        raise
    return conn


@transports
def test_hello_succeeds(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            conn = await dial_and_use(listener.addresses[0], client, server.agent_id)
            assert conn.peer.agent_id == server.agent_id
            assert conn.peer.transport == transport
            assert conn.peer.hello.peer_agent_id == (client.agent_id if transport != "unix" else "")
            assert node.peers == [client.agent_id]
            await conn.close()
            assert conn.closed
            with pytest.raises(ConnectionClosed):
                await conn.recv()

    run(main())


@transports
def test_wrong_expected_agent_id(transport: str, sockdir: Path) -> None:
    server, client, other = Identity.generate(), Identity.generate(), Identity.generate()

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(listener.addresses[0], client, other.agent_id)
            assert exc_info.value.reason == "wrong_peer"
            assert node.peers == []

    run(main())


@transports
def test_bad_hello_signature(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    def corrupt(d: HelloDraft) -> bytes:
        raw = sign_hello(client, d.hello, d.domain)
        return raw[:-1] + bytes([raw[-1] ^ 0x01])  # field 15 is last: flip a signature bit

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(listener.addresses[0], client, server.agent_id, cfg(hello_hook=corrupt))
            assert exc_info.value.reason == "hello_bad_signature"
            assert node.peers == []

    run(main())


@transports
def test_stale_timestamp(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    def old(d: HelloDraft) -> None:
        d.hello.timestamp -= 3_600_000_000

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(listener.addresses[0], client, server.agent_id, cfg(hello_hook=old))
            assert exc_info.value.reason == "stale_hello"
            assert node.peers == []

    run(main())


@transports
def test_replayed_hello_nonce(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()
    captured: list[bytes] = []

    def capture(d: HelloDraft) -> bytes:
        raw = sign_hello(client, d.hello, d.domain)
        captured.append(raw)
        return raw

    def replay(d: HelloDraft) -> bytes:
        return captured[0]  # the first connection's HELLO, byte for byte

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            conn = await dial_and_use(listener.addresses[0], client, server.agent_id, cfg(hello_hook=capture))
            await conn.close()
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(listener.addresses[0], client, server.agent_id, cfg(hello_hook=replay))
            assert exc_info.value.reason == "replayed_hello"
            assert node.peers == [client.agent_id]

    run(main())


@transports
def test_reflected_hello(transport: str, sockdir: Path) -> None:
    """A HELLO sent back to its sender fails: each role signs in its own domain."""
    server, client = Identity.generate(), Identity.generate()
    reflect = cfg(hello_hook=lambda d: d.peer_hello_bytes)

    async def main() -> None:
        if transport == "unix":
            # The server speaks first: the client reflects the server's HELLO at it.
            node, listener = await start(transport, sockdir, server)
            async with listener:
                with pytest.raises(HandshakeError) as exc_info:
                    await dial_and_use(listener.addresses[0], client, server.agent_id, reflect)
                assert exc_info.value.reason == "hello_bad_signature"
                assert node.peers == []
        else:
            # The client speaks first: a server reflects the client's HELLO at it.
            node, listener = await start(transport, sockdir, server, reflect)
            async with listener:
                with pytest.raises(HandshakeError) as exc_info:
                    await dial_and_use(listener.addresses[0], client, server.agent_id)
                assert exc_info.value.reason == "hello_bad_signature"

    run(main())


@transports
def test_message_from_other_than_hello_peer(transport: str, sockdir: Path) -> None:
    """A transport delivers MESSAGE frames unopened; the node's receive pipeline closes a
    connection on which the peer sends a message signed by someone else."""
    from iac.node import Node, NodeConfig
    from iac.protocol.clock import now_us
    from iac.wire import MessageType, build_message, encode_message_frame

    server, client, mallory = Identity.generate(), Identity.generate(), Identity.generate()

    async def main() -> None:
        config = NodeConfig(transport=FAST)
        async with (
            Node(server, listen=[listen_url(transport, sockdir)], config=config) as node,
            Node(config=config) as honest,
        ):
            conn = await dial(node.addresses[0], client, expect=server.agent_id, config=FAST)
            # correctly signed, but by someone other than the peer the HELLO proved
            msg = build_message(sender=mallory.agent_id, to=server.agent_id, msg_type=MessageType.PING,
                                session=Session(), timestamp_us=now_us())  # fmt: skip
            await conn.send(encode_message_frame(mallory, msg))
            with pytest.raises(ConnectionClosed) as info:
                await conn.recv()
            assert info.value.code == CloseCode.IMPERSONATION
            await conn.wait_closed()
            # the node goes on serving others
            honest.add_peer(server.agent_id, *node.addresses)
            assert (await honest.request(server.agent_id, MessageType.PING, timeout=5)).payload is None

    run(main())


@transports
def test_admission_denied(transport: str, sockdir: Path) -> None:
    server, client, friend = Identity.generate(), Identity.generate(), Identity.generate()
    policy = cfg(admission=lambda agent_id: agent_id == friend.agent_id)

    async def main() -> None:
        node, listener = await start(transport, sockdir, server, policy)
        async with listener:
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(listener.addresses[0], client, server.agent_id)
            assert exc_info.value.reason == "admission_denied"
            ok = await dial_and_use(listener.addresses[0], friend, server.agent_id)
            await ok.close()
            assert node.peers == [friend.agent_id]

    run(main())


# --- CA mode: only clients with a certificate of the node's CA, on TLS and on QUIC ---------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ca.pem`` with server and client certificates, a stranger's from another CA, and an
    expired one from the right CA."""
    d = tmp_path_factory.mktemp("certs")
    init_ca(d, ["server", "client"])
    init_ca(d / "other", ["stranger"])
    late = CertAuthority.load(d).issue(
        "late", valid_from=dt.datetime.now(dt.UTC) - dt.timedelta(days=30), days=1
    )
    (d / "late.pem").write_bytes(late.cert_pem)
    (d / "late.key").write_bytes(late.key_pem)
    (d / "late.key").chmod(0o600)
    return d


def ca_config(certs: Path, cert: str | None = None, **kw: object) -> TransportConfig:
    """CA mode with the node's CA; ``cert``: the certificate (and key) this side presents."""
    files = (
        {}
        if cert is None
        else {"cert_file": str(certs / f"{cert}.pem"), "key_file": str(certs / f"{cert}.key")}
    )
    return cfg(ca_file=str(certs / "ca.pem"), **files, **kw)


#: What the client presents, and the TLS alert a refusal arrives with (QUIC: admission_denied).
CLIENT_MATERIAL = {
    "no_certificate": (None, "certificate required"),
    "another_ca": ("other/stranger", "unknown ca"),
    "expired": ("late", "certificate expired"),
}


@pytest.mark.parametrize("material", sorted(CLIENT_MATERIAL))
@pytest.mark.parametrize("transport", ["quic", "tls"])
def test_ca_mode_refuses_a_client_without_a_valid_certificate(
    transport: str, material: str, certs: Path
) -> None:
    """A node in CA mode serves only clients whose certificate chains to its CA: no certificate,
    one from another CA, and an expired one are refused on TLS and on QUIC alike (QUIC servers
    once asked for none), and the refusal says why."""
    server, client, friend = Identity.generate(), Identity.generate(), Identity.generate()
    cert, alert = CLIENT_MATERIAL[material]
    # the client trusts the server's CA (it verifies the server) but presents what it has
    client_config = cfg() if cert is None else ca_config(certs, cert)

    async def main() -> None:
        node = EchoNode(server)
        listener = await listen(f"{transport}://127.0.0.1:0", server, node, config=ca_config(certs, "server"))
        async with listener:
            url = listener.addresses[0]
            if transport == "quic":
                with pytest.raises(HandshakeError, match="client certificate") as exc_info:
                    await dial_and_use(url, client, server.agent_id, client_config)
                assert exc_info.value.reason == "admission_denied"
            else:
                with pytest.raises(ConnectionClosed, match=f"TLS alert from the server: {alert}") as info:
                    await dial_and_use(url, client, server.agent_id, client_config)
                assert info.value.peer_reason == f"tls alert: {alert}"
            ok = await dial_and_use(url, friend, server.agent_id, ca_config(certs, "client"))
            await ok.close()
            assert node.peers == [friend.agent_id]
            refused = getattr(listener, "refused", {})
            assert refused == {"admission_denied" if transport == "quic" else "tls_handshake_failed": 1}

    run(main())


def test_tls_man_in_the_middle_is_refused(sockdir: Path) -> None:
    """A relay that terminates TLS with its own certificate and relays both HELLOs
    unchanged: the client's HELLO is bound to the relay's certificate. (UNIX has no
    certificate; the QUIC relay version lives with the QUIC adapter's tests.)"""
    import ssl

    transport = "tls"

    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        target = listener.addresses[0].removeprefix("tls://")
        host, port = target.rsplit(":", 1)
        mitm_cert = generate_self_signed("mallory")
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.set_alpn_protocols([ALPN])
        mitm_cert.load_into(sctx)
        cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        cctx.check_hostname = False
        cctx.verify_mode = ssl.CERT_NONE
        cctx.set_alpn_protocols([ALPN])
        relayed: list[int] = []

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    relayed.append(len(data))
                    w.write(data)
                    await w.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                w.close()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            ur, uw = await asyncio.open_connection(host, int(port), ssl=cctx)
            await asyncio.gather(pipe(r, uw), pipe(ur, w))

        mitm = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=sctx)
        mport = mitm.sockets[0].getsockname()[1]
        async with listener:
            with pytest.raises(HandshakeError) as exc_info:
                await dial_and_use(f"tls://127.0.0.1:{mport}", client, server.agent_id)
            assert exc_info.value.reason == "channel_binding_mismatch"
            assert relayed, "the relay carried the HELLOs"
            assert node.peers == []
        mitm.close()

    run(main())


@transports
def test_10000_messages_each_way(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()
    n = 10_000

    async def exchange(conn: Connection, me: Identity) -> list[int]:
        session = Session()

        async def sender() -> None:
            for _ in range(n):
                await conn.send(ping_frame(me, conn.peer.agent_id, session))

        async def receiver() -> list[int]:
            got = []
            while len(got) < n:
                inc = await conn.recv()
                assert message_of(inc) is not None
                got.append(message_of(inc).msg_id)
            return got

        _, got = await asyncio.gather(sender(), receiver())
        return got

    server_got: asyncio.Future[list[int]]

    async def on_conn(conn: Connection) -> None:
        await settle(server_got, exchange(conn, server))
        await conn.wait_closed()

    async def main() -> None:
        nonlocal server_got
        server_got = asyncio.get_running_loop().create_future()
        listener = await listen(listen_url(transport, sockdir), server, on_conn, config=FAST)
        async with listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=FAST)
            client_got = await exchange(conn, client)
            got = await server_got
            await conn.close()
        for ids in (client_got, got):
            assert len(ids) == n and sorted(set(ids)) == list(range(1, n + 1))

    run(main(), timeout=60)


@transports
def test_oversized_frame_closes_only_that_connection(transport: str, sockdir: Path) -> None:
    from iac.wire.frames import FrameType, encode_frame

    server, client = Identity.generate(), Identity.generate()
    small = cfg(max_frame_size=64 * 1024)

    async def main() -> None:
        _node, listener = await start(transport, sockdir, server, small)
        async with listener:
            good = await dial_and_use(listener.addresses[0], client, server.agent_id)
            bad = await dial_and_use(listener.addresses[0], client, server.agent_id)
            big = encode_frame(FrameType.MESSAGE, os.urandom(100 * 1024), max_frame_size=1 << 20)
            await bad.send(big)
            with pytest.raises(ConnectionClosed) as info:
                await bad.recv()
            assert info.value.code == CloseCode.FRAME_TOO_LARGE
            for _ in range(3):
                await roundtrip(good, client)
            await good.close()

    run(main())


NODE_SCRIPT = """
import asyncio, sys
from iac.wire.identity import Identity
from iac.wire.message import Session
from iac.transport import listen
from iac.transport.base import TransportConfig
from conftest import EchoNode  # the tests directory is on PYTHONPATH

async def main():
    ident = Identity.from_seed(bytes.fromhex(sys.argv[1]))
    listener = await listen(sys.argv[2], ident, EchoNode(ident), config=TransportConfig())
    print(listener.addresses[0], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@transports
def test_peer_killed_mid_stream(transport: str, sockdir: Path) -> None:
    """SIGKILL the node while the client has requests in flight: pending sends and
    recv fail with a typed error (TransportError), none hangs."""
    server, client = Identity.generate(), Identity.generate()
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, server.seed().hex(), listen_url(transport, sockdir)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))},
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url, "the node did not start"
        # QUIC learns of a dead peer only from silence: keep its idle timer short.
        config = cfg(keepalive_interval=0.5, idle_timeout=2.0, send_queue_frames=64)

        async def main() -> None:
            conn = await dial(url, client, expect=server.agent_id, config=config)
            await roundtrip(conn, client)
            session = Session()
            replies = 0
            killed = asyncio.Event()

            async def sender() -> None:
                while True:  # keeps the send queue full: send() waits for room
                    await conn.send(ping_frame(client, server.agent_id, session, "x" * 200))

            async def receiver() -> None:
                nonlocal replies
                while True:
                    await conn.recv()
                    replies += 1
                    if replies == 100:
                        proc.send_signal(signal.SIGKILL)
                        killed.set()

            results = await asyncio.gather(sender(), receiver(), return_exceptions=True)
            assert killed.is_set()
            for r in results:
                assert isinstance(r, TransportError), repr(r)
            with pytest.raises(TransportError):
                await conn.send(ping_frame(client, server.agent_id, session))

        run(main(), timeout=20)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@transports
def test_frames_in_one_turn_and_close_flushes(transport: str, sockdir: Path) -> None:
    """Frames queued before close() are all delivered before the GOAWAY."""
    server, client = Identity.generate(), Identity.generate()
    got: list[int] = []
    done: asyncio.Future[int]

    async def receive_until_closed(conn: Connection) -> int:
        try:
            while True:
                inc = await conn.recv()
                assert message_of(inc) is not None
                got.append(message_of(inc).msg_id)
        except ConnectionClosed as exc:
            return exc.code

    async def on_conn(conn: Connection) -> None:
        await settle(done, receive_until_closed(conn))

    async def main() -> None:
        nonlocal done
        done = asyncio.get_running_loop().create_future()
        listener = await listen(listen_url(transport, sockdir), server, on_conn, config=FAST)
        async with listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=FAST)
            session = Session()
            for _ in range(50):
                await conn.send(ping_frame(client, server.agent_id, session))
            await conn.close()
            assert await done == CloseCode.NO_ERROR
        # QUIC carries each message on its own stream: all arrive, order is not promised
        assert sorted(got) == list(range(1, 51))
        if transport != "quic":
            assert got == list(range(1, 51))

    run(main())


@transports
def test_reply_helper_roundtrip(transport: str, sockdir: Path) -> None:
    """The echo node answers with REPLY naming the request (sanity for the helpers)."""
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        _, listener = await start(transport, sockdir, server)
        async with listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=FAST)
            session = Session()
            await conn.send(ping_frame(client, server.agent_id, session))
            inc = await conn.recv()
            assert message_of(inc) is not None and message_of(inc).reply_to == 1
            assert message_of(inc).reply_session_id == session.session_id
            await conn.close()

    assert reply_frame  # imported for the node script's sake
    run(main())


@transports
def test_bad_message_signature_is_refused_connection_goes_on(transport: str, sockdir: Path) -> None:
    from iac.wire.frames import FrameType, decode_frame, encode_frame

    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        node, listener = await start(transport, sockdir, server)
        async with listener:
            conn = await dial_and_use(listener.addresses[0], client, server.agent_id)
            good = decode_frame(ping_frame(client, server.agent_id, Session()))
            body = good.body[:-1] + bytes([good.body[-1] ^ 1])  # still well-formed, signature broken
            await conn.send(encode_frame(FrameType.MESSAGE, body))
            await roundtrip(conn, client)  # the connection goes on
            assert len(node.rejected) == 1 and node.rejected[0].reason == "bad_signature"
            await conn.close()

    run(main())


@transports
def test_idle_connection_is_closed(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()
    idle = cfg(idle_timeout=0.3)

    async def main() -> None:
        _node, listener = await start(transport, sockdir, server)
        async with listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=idle)
            await roundtrip(conn, client)
            with pytest.raises(ConnectionClosed) as info:
                await conn.recv()
            assert info.value.code == CloseCode.IDLE_TIMEOUT
            await conn.wait_closed()

    run(main())


@transports
def test_send_waits_when_queue_is_full(transport: str, sockdir: Path) -> None:
    """Backpressure: with a peer that does not read, send() blocks instead of buffering without bound."""
    server, client = Identity.generate(), Identity.generate()
    release = asyncio.Event()

    async def lazy(conn: Connection) -> None:
        await release.wait()
        await conn.close()

    async def main() -> None:
        listener = await listen(listen_url(transport, sockdir), server, lazy, config=FAST)
        async with listener:
            small = cfg(send_queue_frames=8, send_queue_bytes=64 * 1024)
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=small)
            session = Session()
            sent = 0

            async def flood() -> None:
                nonlocal sent
                while True:
                    await conn.send(ping_frame(client, server.agent_id, session, "y" * 4000))
                    sent += 1

            task = asyncio.create_task(flood())
            done, _ = await asyncio.wait([task], timeout=1.0)
            assert not done, "send() never waited"
            assert sent < 100_000
            release.set()
            with pytest.raises(TransportError):
                await task

    run(main())


def test_unix_uid_policy_and_private_dir(sockdir: Path) -> None:
    from iac.errors import ConfigError

    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        nobody = cfg(allowed_uids=frozenset({os.getuid() + 1}))
        node, listener = await start("unix", sockdir, server, nobody)
        async with listener:
            sock = Path(listener.addresses[0].removeprefix("unix://"))
            assert sock.stat().st_mode & 0o777 == 0o600
            assert sock.parent.stat().st_mode & 0o777 == 0o700
            with pytest.raises(HandshakeError, match="uid") as exc_info:
                await dial(listener.addresses[0], client, expect=server.agent_id, config=FAST)
            assert exc_info.value.reason == "admission_denied"
        assert not sock.exists()
        open_dir = sockdir / "open"
        open_dir.mkdir(mode=0o755)
        open_dir.chmod(0o755)
        with pytest.raises(ConfigError, match="private"):
            await listen(f"unix://{open_dir}/n.sock", server, node, config=FAST)

    run(main())


def test_session_logic_and_connection_table() -> None:
    from iac.errors import HandshakeError, ProtocolError
    from iac.node.verify import open_frame
    from iac.transport.base import ConnectionTable
    from iac.transport.session import EarlyFrames, PeerGoaway, SessionLogic
    from iac.wire.frames import Frame, FrameType

    a, b = Identity.generate(), Identity.generate()
    logic = SessionLogic(a.agent_id)
    from iac.wire.frames import decode_frame

    ok = logic.on_frame(decode_frame(ping_frame(a, b.agent_id, Session())))
    assert ok is not None and not isinstance(ok, PeerGoaway) and message_of(ok).to == b.agent_id
    # The transport delivers a MESSAGE of another origin unopened: proving it is the node's job.
    other = logic.on_frame(decode_frame(ping_frame(b, a.agent_id, Session())))
    assert other is not None and not isinstance(other, PeerGoaway)
    with pytest.raises(ProtocolError) as exc_info:
        open_frame(other.frame.body, a.agent_id)
    assert exc_info.value.reason == "impersonation"
    with pytest.raises(HandshakeError) as exc_info:
        logic.on_frame(Frame(FrameType.HELLO, b""))
    assert exc_info.value.reason == "unexpected_hello"
    assert logic.on_frame(Frame(FrameType.DICT_ACK, b"")) is None
    early = EarlyFrames(2)
    early.hold(Frame(FrameType.MESSAGE, b""))
    early.hold(Frame(FrameType.MESSAGE, b""))
    from iac.errors import ProtocolError

    with pytest.raises(ProtocolError) as exc_info:
        early.hold(Frame(FrameType.MESSAGE, b""))
    assert exc_info.value.reason == "buffer_exceeded"

    class Fake:
        def __init__(self, peer: str, dialed: bool) -> None:
            from iac.transport.base import PeerInfo
            from iac.wire._pb.iac_pb2 import Hello

            self.peer = PeerInfo(peer, "tls", "tls://x:1", Hello(), dialed=dialed)
            self.closed = False

    lo, hi = sorted([a.agent_id, b.agent_id])
    # this side is `lo`: the connection it dialed is kept, whichever arrives first
    table = ConnectionTable(lo)
    mine, theirs = Fake(hi, dialed=True), Fake(hi, dialed=False)
    assert table.add(theirs) == (theirs, None)  # type: ignore[arg-type]
    assert table.add(mine) == (mine, theirs)  # type: ignore[arg-type]
    # the other side (`hi`) keeps the one `lo` dialed too: the one it accepted
    table2 = ConnectionTable(hi)
    dialed_by_hi, accepted_from_lo = Fake(lo, dialed=True), Fake(lo, dialed=False)
    assert table2.add(accepted_from_lo) == (accepted_from_lo, None)  # type: ignore[arg-type]
    assert table2.add(dialed_by_hi) == (accepted_from_lo, dialed_by_hi)  # type: ignore[arg-type]
