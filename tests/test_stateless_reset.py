"""QUIC stateless reset (docs/PROTOCOL.md, "Stateless reset"): tokens derived from the node's key,
a receiver restarted under SIGKILL resets the sender's connection at once, forged resets are
ignored and counted."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
from conftest import ROOT, run
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from ports import free_udp_port

from iac.transport.base import Connection
from iac.transport.quic import dial_quic, listen_quic
from iac.transport.quic.backend import get_backend
from iac.transport.quic.connection import RESET_MESSAGE
from iac.transport.quic.reset import (
    MAX_RESET,
    MIN_RESET,
    MIN_TRIGGER,
    RESET_SALT,
    TOKEN_SIZE,
    Bucket,
    ResetTokens,
    build_reset,
    matches,
    reset_key,
    reset_token,
)
from iac.wire.identity import Identity

VECTORS = json.loads((ROOT / "proto" / "testvectors" / "reset-v1.json").read_text("utf-8"))


def test_the_token_vectors_are_hkdf_of_the_seed_keyed_by_the_connection_id() -> None:
    assert VECTORS["salt"].encode() == RESET_SALT
    for case in VECTORS["cases"]:
        seed, cid = bytes.fromhex(case["seed"]), bytes.fromhex(case["cid"])
        hkdf = HKDF(algorithm=hashes.SHA256(), length=TOKEN_SIZE, salt=RESET_SALT, info=cid).derive(seed)
        assert reset_token(reset_key(seed), cid) == hkdf == bytes.fromhex(case["token"])
        assert ResetTokens(seed)(cid) == hkdf
    a, b, c = (bytes.fromhex(x["token"]) for x in VECTORS["cases"])
    assert len({a, b, c}) == 3  # another seed, another connection ID: another token
    # never from public values: the node's public key does not give the token
    seed = bytes.fromhex(VECTORS["cases"][0]["seed"])
    cid = bytes.fromhex(VECTORS["cases"][0]["cid"])
    assert reset_token(reset_key(Identity.from_seed(seed).public_key), cid) != a
    packet = VECTORS["packet"]
    unpredictable = bytes.fromhex(packet["unpredictable"])
    got = build_reset(a, packet["trigger_size"], random=lambda n: unpredictable[:n])
    assert got == bytes.fromhex(packet["datagram"])


def test_a_reset_is_shorter_than_its_trigger_looks_like_a_short_header_and_none_answers_a_tiny_one() -> None:
    token = bytes(range(16))
    assert build_reset(token, MIN_TRIGGER - 1) is None  # a reset could not be shorter
    for size in (MIN_TRIGGER, 30, 44, 1200):
        reset = build_reset(token, size)
        assert reset is not None
        assert MIN_RESET <= len(reset) < size and len(reset) <= MAX_RESET
        assert reset[0] & 0xC0 == 0x40 and reset.endswith(token)
        assert matches(reset, [os.urandom(16), token]) and not matches(reset, [os.urandom(16)])
    # two endpoints that both lost state answer each other with ever shorter resets, then stop
    size, answers = 1200, 0
    while (reset := build_reset(token, size)) is not None:
        size, answers = len(reset), answers + 1
    assert answers == MAX_RESET - MIN_RESET + 1


def test_the_reset_rate_is_bounded_by_a_bucket_on_the_injected_clock() -> None:
    bucket = Bucket(rate=20.0, burst=5)
    assert [bucket.take(100.0) for _ in range(6)] == [True] * 5 + [False]
    assert not bucket.take(100.01)
    assert bucket.take(100.06)  # 1/20 s later: one more
    assert sum(bucket.take(200.0) for _ in range(50)) == 5  # never more than the burst


async def _nothing(conn: Connection) -> None:
    await conn.wait_closed()


def restartable_node(
    tmp_path: Path,
) -> tuple[Callable[[], Awaitable[asyncio.subprocess.Process]], str, str]:
    """A saved key and a free QUIC address: what starts `iac node` there (again after a kill),
    its agent id and the address."""
    key = tmp_path / "r.key"
    Identity.generate().save(key)
    url = f"quic://127.0.0.1:{free_udp_port()}"
    return partial(start_node, key, url), Identity.load(key).agent_id, url


async def start_node(key: Path, url: str) -> asyncio.subprocess.Process:
    """`iac node` with ``key`` listening on ``url``, once it printed its ID and address."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "iac", "node", "--key", str(key), "--listen", url, "--no-admin",
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    for _ in range(2):  # node ID / listening URL
        assert await asyncio.wait_for(proc.stdout.readline(), 20)
    return proc


@pytest.mark.skipif(get_backend().resets is None, reason="stateless resets need aioquic 1.7")
def test_a_receiver_restarted_under_sigkill_resets_the_senders_connections_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`iac node` killed with SIGKILL and started again with its key on its port: the first packet
    of each old connection (dialed from a listener's socket, and from a socket of its own) is
    answered with a stateless reset that closes it, instead of probes running out."""

    async def main() -> None:
        receiver, rid, url = restartable_node(tmp_path)
        proc = await receiver()
        listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), _nothing)
        try:
            shared = await dial_quic(url, listener.identity, expect=rid, listener=listener)
            own = await dial_quic(url, Identity.generate(), expect=rid)
            assert shared.shared_socket and not own.shared_socket
            assert await shared.alive(2) and await own.alive(2)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            proc = await receiver()
            with caplog.at_level(logging.INFO, logger="iac.transport.quic"):
                # one probe each: its packet reaches the new process, which answers it with a reset
                assert await asyncio.wait_for(asyncio.gather(shared.alive(10), own.alive(10)), 10) == [
                    False,
                    False,
                ]
            for conn in (shared, own):
                err = conn.close_error
                assert err is not None and str(err) == RESET_MESSAGE, err
                assert getattr(err, "reason", None) == "stateless_reset"
            assert listener.resets.received == 1  # the shared socket's: counted by its listener
            assert sum(RESET_MESSAGE in r.getMessage() for r in caplog.records) == 2
            again = await dial_quic(url, listener.identity, expect=rid, listener=listener)
            assert await again.alive(2)  # the restarted receiver serves the sender again
            await again.close()
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await listener.close()

    run(main(), timeout=60)


@pytest.mark.skipif(get_backend().resets is None, reason="stateless resets need aioquic 1.7")
def test_a_forged_reset_is_ignored_and_counted_and_an_unknown_connection_is_answered_with_a_reset() -> None:
    async def main() -> None:
        a_id, b_id = Identity.generate(), Identity.generate()
        b = await listen_quic("quic://127.0.0.1:0", b_id, _nothing)
        a = await listen_quic("quic://127.0.0.1:0", a_id, _nothing)
        loop = asyncio.get_running_loop()
        forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        forger.bind(("127.0.0.1", 0))
        forger.setblocking(False)
        try:
            conn = await dial_quic(b.addresses[0], a_id, expect=b_id.agent_id, listener=a)
            assert await conn.alive(2)
            hooks = a.backend.resets
            assert hooks is not None
            real = hooks.peer_tokens(conn.quic)  # what a real reset from b would end with
            assert real and all(len(t) == TOKEN_SIZE for t in real)
            a_port = int(a.addresses[0].rsplit(":", 1)[1])
            cid = os.urandom(8)
            forged = [
                bytes([0x40]) + cid + os.urandom(40 - 9 - TOKEN_SIZE) + os.urandom(TOKEN_SIZE),  # wrong token
                bytes([0x40]) + cid + os.urandom(40 - 9 - TOKEN_SIZE) + real[0],  # right token, wrong socket
            ]
            for n, datagram in enumerate(forged, 1):
                await loop.sock_sendto(forger, datagram, ("127.0.0.1", a_port))
                # a is a node that does not know that connection ID: it answers with its own reset
                answer, _ = await asyncio.wait_for(loop.sock_recvfrom(forger, 2048), 5)
                assert len(answer) < len(datagram) and answer[0] & 0xC0 == 0x40
                assert answer.endswith(ResetTokens(a_id.seed())(cid))
                assert a.resets.ignored == n and a.resets.sent == n and a.resets.received == 0
            assert not conn.closed and await conn.alive(2)  # the connection did not end
            assert conn.close_error is None
            # too small to be answered with a shorter reset: not answered
            tiny = bytes([0x40]) + cid + os.urandom(MIN_TRIGGER - 10)
            await loop.sock_sendto(forger, tiny, ("127.0.0.1", a_port))
            assert await conn.alive(2)
            assert a.resets.sent == 2 and a.resets.unanswered == 1
            await conn.close()
        finally:
            forger.close()
            await a.close()
            await b.close()

    run(main())


@pytest.mark.skipif(get_backend().resets is None, reason="stateless resets need aioquic 1.7")
def test_a_node_forgets_the_ticket_of_a_server_that_reset_and_its_next_request_is_answered(
    tmp_path: Path,
) -> None:
    """A node holding a session ticket of `iac node` (0-RTT is on by default) sees the restarted
    process's stateless reset: the ticket of the old process goes with the connection, so the next
    request dials in full and is answered, instead of its 0-RTT HELLO being bound to the old
    process's certificate, refused, and the request waiting out its timeout."""
    from iac import MessageType, Node

    async def main() -> None:
        receiver, rid, url = restartable_node(tmp_path)
        proc = await receiver()
        try:
            async with Node() as node:
                node.add_peer(rid, url)
                assert (await node.request(rid, MessageType.PING, timeout=10)).payload is None
                await node.connect(rid)  # a ticket of this process is held once its HELLO verified
                first = node.connection(rid)
                assert first is not None
                await node.request(rid, MessageType.PING, timeout=10)
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                proc = await receiver()
                assert await first.alive(10) is False  # the new process answered with a reset
                assert getattr(first.close_error, "reason", None) == "stateless_reset"
                assert (await node.request(rid, MessageType.PING, timeout=5)).payload is None
                assert node.stats().zero_rtt["early_rejected"] == 0
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    run(main(), timeout=60)
