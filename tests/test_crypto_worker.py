"""Ed25519 on the crypto worker thread: received frames verified in batches, outgoing messages
signed in batches (``iac.node.verify``, ``iac.node.sign``).

What users rely on: a batch gives the same verdicts, in the same order, as one frame at a time
(a forged frame in the middle is refused alone); signatures made on the worker are the ones the
loop would make, handed back in the order they were asked for, also across batches; a worker
that cannot take work hands the work back to the loop; and a job that raised is a
a ``worker_failed`` :class:`~iac.errors.LocalError` for its callers (a connection closed with
INTERNAL_ERROR), never a wait
without end (each test runs under ``run``'s timeout).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from test_pipeline import RawPeer, errors, serving, tamper

from iac.errors import CloseCode, ConnectionClosed, LocalError, MessageRejected
from iac.node import sign as sign_mod
from iac.node import verify as verify_mod
from iac.node.config import NodeConfig
from iac.node.crypto import CryptoWorker
from iac.node.node import Context, Node
from iac.node.sign import Signer
from iac.node.verify import Verifier
from iac.wire._pb.iac_pb2 import Message, MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sign_message

ALICE = Identity.generate()
BOB = Identity.generate()


SESSION = Session()


@functools.cache
def _unsigned(i: int) -> bytes:
    return build_message(
        sender=ALICE.agent_id, to=BOB.agent_id, msg_type=MessageType.RUN, session=SESSION,
        timestamp_us=1_000_000 + i, payload_json=f'{{"i": {i}}}',
    ).SerializeToString()  # fmt: skip


def message(i: int) -> Message:
    """Message ``i`` (the same every time: its id and timestamp are fixed), unsigned."""
    return Message.FromString(_unsigned(i))


def body(i: int) -> bytes:
    return sign_message(ALICE, message(i))


# --- verification --------------------------------------------------------------------------------


def tampered_body(i: int) -> bytes:
    """Signed bytes of message ``i`` with one payload byte changed: well-formed, signature bad."""
    msg = Message.FromString(body(i))
    msg.payload_json = msg.payload_json.replace("i", "j")
    return msg.SerializeToString(deterministic=True)


def test_a_batch_refuses_a_forged_frame_in_the_middle_and_keeps_the_order() -> None:
    async def main() -> None:
        worker = CryptoWorker()
        verifier = Verifier(worker)
        bodies = [body(0), body(1), tampered_body(2), body(3), body(4)]
        try:
            opened = await verifier.open(bodies, ALICE.agent_id)
        finally:
            worker.close()
        assert verifier.batches == 1 and verifier.offloaded == 5  # it went to the worker
        assert [type(o) for o in opened] == [Message, Message, MessageRejected, Message, Message]
        assert isinstance(opened[2], MessageRejected)
        assert [o.timestamp for o in opened if isinstance(o, Message)] == [
            1_000_000,
            1_000_001,
            1_000_003,
            1_000_004,
        ]
        # the same verdicts as one frame at a time on the loop
        one_by_one = await Verifier(worker, threaded=False).open(bodies, ALICE.agent_id)
        assert [type(o) for o in one_by_one] == [type(o) for o in opened]

    run(main())


def test_a_verification_worker_that_raises_is_worker_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(bodies: object, peer: str) -> list[object]:
        raise MemoryError("no memory for the batch")

    monkeypatch.setattr(verify_mod, "open_all", broken)

    async def main() -> None:
        worker = CryptoWorker()
        try:
            with pytest.raises(LocalError, match="verification worker failed: MemoryError") as exc_info:
                await Verifier(worker).open([body(0), body(1)], ALICE.agent_id)
            assert exc_info.value.reason == "worker_failed"
        finally:
            worker.close()

    run(main())


def test_a_worker_that_cannot_take_work_hands_ed25519_back_to_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        worker = CryptoWorker()
        verifier = Verifier(worker)
        await verifier.open([body(0), body(1)], ALICE.agent_id)  # started
        worker.close()
        assert not worker.available
        opened = await verifier.open([body(0), tampered_body(1), body(2)], ALICE.agent_id)
        assert [type(o) for o in opened] == [Message, MessageRejected, Message]  # the same verdicts
        assert verifier.batches == 1  # the second batch was opened on the loop
        signer = Signer(ALICE, worker)
        signer.batching = True
        got = await asyncio.gather(*(signer.sign(message(i)) for i in range(3)))
        assert got == [sign_message(ALICE, message(i)) for i in range(3)] and signer.batches == 0
        with pytest.raises(LocalError, match="cannot take work") as exc_info:  # asked directly: it says so
            await worker.run("verification", len, b"")
        assert exc_info.value.reason == "worker_failed"

    with caplog.at_level(logging.WARNING, logger="iac.node"):
        run(main())


def test_a_forged_frame_among_others_over_the_wire_is_refused_alone_and_the_rest_in_order() -> None:
    """Frames written back to back reach the node's read loop together: a bad signature among
    them is refused and counted, the others are handled in the order they were sent."""

    async def main() -> None:
        async with serving() as (node, woke), RawPeer.connect(node) as peer:
            frames = []
            for i in range(6):
                msg = peer.message(MessageType.RUN, f"a{i}")  # tamper() changes the "a"
                signed = sign_message(peer.identity, msg)
                frames.append(tamper(signed) if i == 3 else encode_frame(FrameType.MESSAGE, signed))
            await peer.conn.send(b"".join(frames))  # one write: the node reads them as one batch
            await peer.barrier()
            assert woke == ["a0", "a1", "a2", "a4", "a5"]
            assert node._runtime.verifier.offloaded >= 6  # they were opened together on the worker
            assert node.stats().refused == {"bad_signature": 1}

    run(main())


# --- signing -------------------------------------------------------------------------------------


def test_one_sender_at_a_time_signs_on_the_loop() -> None:
    async def main() -> None:
        worker = CryptoWorker()
        signer = Signer(ALICE, worker)
        try:
            for i in range(20):
                assert await signer.sign(message(i)) == sign_message(ALICE, message(i))
                await asyncio.sleep(0)  # a turn of the loop ends between them
        finally:
            worker.close()
        assert not signer.batching and signer.batches == 0

    run(main())


REAL_SIGN_ALL = sign_mod.sign_all


def worker_signs_with(
    monkeypatch: pytest.MonkeyPatch, fn: Callable[[Identity, list[bytes]], list[bytes]]
) -> None:
    """What the signing worker runs, for one test (``REAL_SIGN_ALL`` is the real one)."""
    monkeypatch.setattr(sign_mod, "sign_all", fn)


def test_many_senders_sign_in_batches_on_the_worker_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: set[str] = set()

    def spy(identity: Identity, unsigned: list[bytes]) -> list[bytes]:
        threads.add(threading.current_thread().name)
        return REAL_SIGN_ALL(identity, unsigned)

    worker_signs_with(monkeypatch, spy)

    async def main() -> None:
        worker = CryptoWorker()
        signer = Signer(ALICE, worker)
        done: list[int] = []

        async def one(i: int) -> bytes:
            signed = await signer.sign(message(i))
            done.append(i)
            return signed

        try:
            for start in range(0, 64, 16):  # four turns of 16 senders each
                got = await asyncio.gather(*(one(i) for i in range(start, start + 16)))
                for i, signed in zip(range(start, start + 16), got, strict=True):
                    assert signed == sign_message(ALICE, message(i))  # Ed25519 is deterministic
                    assert open_message(signed).timestamp == 1_000_000 + i
        finally:
            worker.close()
        assert signer.batching and signer.batches >= 3 and signer.offloaded >= 48
        assert threads and all(name.startswith("iac-crypto") for name in threads)
        assert done == list(range(64))  # senders wake in the order they signed

    run(main())


def test_a_small_batch_waits_behind_a_batch_on_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Order across batches: a lone message signed while a batch is out comes back after it."""
    gate = threading.Event()
    calls: list[int] = []

    def slow(identity: Identity, unsigned: list[bytes]) -> list[bytes]:
        calls.append(len(unsigned))
        if len(calls) == 1:
            gate.wait(10)
        return REAL_SIGN_ALL(identity, unsigned)

    worker_signs_with(monkeypatch, slow)

    async def main() -> None:
        worker = CryptoWorker()
        signer = Signer(ALICE, worker)
        signer.batching = True
        order: list[int] = []

        async def one(i: int) -> None:
            await signer.sign(message(i))
            order.append(i)

        try:
            batch = [asyncio.ensure_future(one(i)) for i in range(4)]
            while signer.batches == 0:  # the batch of four went out
                await asyncio.sleep(0)
            lone = asyncio.ensure_future(one(99))
            while signer.batches == 1:  # the lone one went out behind it
                await asyncio.sleep(0)
            gate.set()
            await asyncio.gather(*batch, lone)
        finally:
            worker.close()
        assert order == [0, 1, 2, 3, 99]
        assert calls == [4, 1]

    run(main())


def test_a_signing_worker_that_raises_fails_every_sender_of_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(identity: Identity, unsigned: list[bytes]) -> list[bytes]:
        raise RuntimeError("the signing key went away")

    async def main() -> None:
        worker = CryptoWorker()
        signer = Signer(ALICE, worker)
        signer.batching = True
        worker_signs_with(monkeypatch, broken)
        got = await asyncio.gather(*(signer.sign(message(i)) for i in range(3)), return_exceptions=True)
        worker_signs_with(monkeypatch, REAL_SIGN_ALL)
        assert [type(g) for g in got] == [LocalError] * 3
        assert "signing worker failed: RuntimeError" in str(got[0])
        # the next batch works again
        assert await asyncio.gather(*(signer.sign(message(i)) for i in range(3))) == [
            sign_message(ALICE, message(i)) for i in range(3)
        ]
        worker.close()

    run(main())


@pytest.mark.parametrize("transport", ["unix", "tls", "quic"])
def test_nodes_that_sign_on_the_worker_answer_many_requests_in_flight(transport: str, sockdir: Path) -> None:
    async def main() -> None:
        cfg = NodeConfig(sign_in_worker=True)
        url = f"unix://{sockdir}/s.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"
        async with Node(listen=[url], config=cfg) as server, Node(config=cfg) as client:

            @server.on(MessageType.RUN)
            async def echo(ctx: Context) -> object:
                await asyncio.sleep(0)
                return {"i": ctx.payload["i"]}

            client.add_peer(server.agent_id, server.addresses[0])
            replies = await asyncio.gather(
                *(client.request(server.agent_id, MessageType.RUN, {"i": i}) for i in range(200))
            )
            assert [r.payload["i"] for r in replies] == list(range(200))
            assert client._outbox.signer.batches > 0  # requests were signed on the worker
            assert server._outbox.signer.batches > 0  # and the async handlers' answers too

    run(main())


def test_a_failed_worker_closes_that_connection_with_internal_error_and_the_node_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch whose verification job raised ends that connection's reading: it is closed with
    INTERNAL_ERROR (never left open and unread), counted and logged; the node goes on serving."""

    async def main() -> None:
        async with serving() as (node, woke):
            real = node._runtime.crypto.run
            failures: list[str] = []

            async def fails_once(what: str, fn: Any, *args: object) -> Any:
                if not failures:
                    failures.append(what)
                    raise LocalError(
                        f"the {what} worker failed: MemoryError: no memory for the batch",
                        reason="worker_failed",
                    )
                return await real(what, fn, *args)

            node._runtime.crypto.run = fails_once  # type: ignore[method-assign]
            async with RawPeer.connect(node) as peer:
                frames = [
                    encode_frame(
                        FrameType.MESSAGE, sign_message(peer.identity, peer.message(MessageType.RUN, i))
                    )
                    for i in range(4)
                ]
                await peer.conn.send(b"".join(frames))  # one write: one batch, to the worker
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(peer.conn.recv(), 5)
                assert closed.value.code == CloseCode.INTERNAL_ERROR
                assert "worker_failed" in closed.value.peer_reason
            assert failures == ["verification"]
            assert node.stats().closed_internal == 1
            assert woke == []
            async with RawPeer.connect(node) as other:
                assert errors(await other.exchange(other.request(MessageType.RUN, "still here"))) == []
            assert woke == ["still here"]

    with caplog.at_level(logging.WARNING, logger="iac.node"):
        run(main())
    assert any("worker_failed" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
