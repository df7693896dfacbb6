"""A connection's reader (``Connection.serve``, iac/transport/reader.py): a batch of received frames
runs right in the transport's receive callback when it can finish there, as the reader's task; one
that has to wait is handed to that task. Order, one batch at a time, the close error, a batch that
writes, closes, raises, stops or is cancelled: on real TLS, UNIX and QUIC connections. And what
it is for: event-loop turns per round trip between two nodes, counted at the selector."""

from __future__ import annotations

import asyncio
import selectors
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from conftest import TRANSPORT_PARAMS, listen_url, message_of, ping_frame, reply_frame, run

from iac.errors import CloseCode, ConnectionClosed, IacError, LocalError
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.transport import dial, listen
from iac.transport.base import Connection, Incoming, Listener, TransportConfig
from iac.transport.reader import Reader
from iac.wire.identity import Identity
from iac.wire.message import Session

FAST = TransportConfig(handshake_timeout=5.0, linger_timeout=0.3)
WAIT = 5.0


def in_receive_callback() -> bool:
    """Whether the calling coroutine was started by :meth:`Reader.deliver` (the adapter's receive
    callback) rather than by a task step (which leaves no Python frame below the coroutine)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is Reader.deliver.__code__:
            return True
        frame = frame.f_back
    return False


class Served:
    """The accepting side: each connection served by ``batch``; what ``serve`` ended with."""

    def __init__(self, batch: Callable[[Served, list[Incoming]], Awaitable[bool]]) -> None:
        self.identity = Identity.generate()
        self.batch = batch
        self.session = Session()
        self.task: asyncio.Task[Any] | None = None
        self.conn: Connection | None = None
        self.running = False  # a batch is running (two at once fail the test)
        self.got: list[str] = []  # the payloads handed out, in order
        self.where: list[bool] = []  # per batch: started in the receive callback?
        self.ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def __call__(self, conn: Connection) -> None:
        self.conn, self.task = conn, asyncio.current_task()

        async def handle(incs: list[Incoming]) -> bool:
            if [message_of(inc).payload_json for inc in incs] == ['"warm"']:
                await self.reply(incs)  # (pair's first exchange: the reader is waiting after it)
                return True
            assert not self.running, "two batches at once"
            self.running = True
            try:
                self.where.append(in_receive_callback())
                assert asyncio.current_task() is self.task
                self.got += [message_of(inc).payload_json for inc in incs]
                return await self.batch(self, incs)
            finally:
                self.running = False

        try:
            await conn.serve(handle, 32)
        except BaseException as exc:
            self.ended.set_result(exc)
            if not isinstance(exc, (IacError, asyncio.CancelledError, RuntimeError)):
                raise
        else:
            self.ended.set_result(None)

    async def reply(self, incs: list[Incoming]) -> None:
        assert self.conn is not None
        for inc in incs:
            await self.conn.send(reply_frame(self.identity, inc, self.session))

    async def outcome(self) -> BaseException | None:
        return await asyncio.wait_for(asyncio.shield(self.ended), WAIT)


class Client:
    def __init__(self, conn: Connection, me: Identity) -> None:
        self.conn, self.me, self.session = conn, me, Session()

    async def send(self, *texts: str) -> None:
        for text in texts:
            await self.conn.send(ping_frame(self.me, self.conn.peer.agent_id, self.session, f'"{text}"'))

    async def replies(self, n: int) -> list[str]:
        return [message_of(await asyncio.wait_for(self.conn.recv(), WAIT)).payload_json for _ in range(n)]


async def pair(transport: str, sockdir: Path, served: Served) -> tuple[Listener, Connection, Identity]:
    listener = await listen(listen_url(transport, sockdir), served.identity, served, config=FAST)
    me = Identity.generate()
    conn = await dial(listener.addresses[0], me, expect=served.identity.agent_id, config=FAST)
    client = Client(conn, me)
    await client.send("warm")
    assert await client.replies(1) == ['"warm"']
    return listener, conn, me


async def until(check: Callable[[], bool]) -> None:
    """Wait (a loop turn at a time, within WAIT) until ``check()`` holds."""
    async with asyncio.timeout(WAIT):
        while not check():
            await asyncio.sleep(0)


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_a_batch_that_can_finish_runs_in_the_receive_callback_as_the_readers_task(
    transport: str, sockdir: Path
) -> None:
    """Requests one at a time: their batches run in the receive callback, with ``current_task()``
    the serving task (``asyncio.timeout`` works there), and each reply is written at once."""

    async def answer(served: Served, incs: list[Incoming]) -> bool:
        async with asyncio.timeout(WAIT):
            await served.reply(incs)
        return True

    async def main() -> None:
        served = Served(answer)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            for i in range(6):
                await client.send(str(i))
                assert await client.replies(1) == [f'"{i}"']
            assert served.where == [True] * 6
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_a_batch_that_waits_goes_on_in_the_readers_task_and_nothing_overtakes_it(
    transport: str, sockdir: Path
) -> None:
    """The first batch waits for a future (it is handed to the serving task); frames that arrive
    meanwhile wait behind it, are handed out in order, one batch at a time, after it ends."""

    gate: asyncio.Future[None]
    after_gate: list[bool] = []

    async def wait_once(served: Served, incs: list[Incoming]) -> bool:
        if len(served.where) == 1:
            await gate
            after_gate.append(in_receive_callback())  # resumed by the task, not a callback
        await served.reply(incs)
        return True

    async def main() -> None:
        nonlocal gate
        gate = asyncio.get_running_loop().create_future()
        served = Served(wait_once)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("a")
            await until(lambda: served.running)
            await client.send("b", "c", "d")
            await until(lambda: served.conn is not None and served.conn.received() == 3)
            assert served.got == ['"a"'] and served.running  # b, c, d wait behind the first batch
            gate.set_result(None)
            assert await client.replies(4) == ['"a"', '"b"', '"c"', '"d"']
            assert served.got == ['"a"', '"b"', '"c"', '"d"']
            assert after_gate == [False]
            await client.send("e")  # the reader is idle again: this one runs in the callback
            assert await client.replies(1) == ['"e"']
            assert served.where[-1] is True
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_a_batch_that_writes_then_closes_its_connection(transport: str, sockdir: Path) -> None:
    """Inside the receive callback a batch answers, then closes the connection (the close waits:
    the rest goes on in the task). The peer reads the answer, then the close with its reason;
    ``serve`` ends with the close error; a frame behind it is dropped, not handed out."""

    async def answer_and_close(served: Served, incs: list[Incoming]) -> bool:
        await served.reply(incs)
        assert served.conn is not None
        await served.conn.close(CloseCode.NO_ERROR, "done here")
        return True

    async def main() -> None:
        served = Served(answer_and_close)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("only")
            assert await client.replies(1) == ['"only"']
            with pytest.raises(ConnectionClosed, match="done here"):
                await asyncio.wait_for(conn.recv(), WAIT)
            ended = await served.outcome()
            assert isinstance(ended, ConnectionClosed) and "closed by this side: done here" in str(ended)
            assert served.where[0] is True and served.got == ['"only"']
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_an_error_raised_in_the_receive_callback_ends_serve_with_it(transport: str, sockdir: Path) -> None:
    """A batch that raises inside the receive callback: ``serve`` raises it in the serving task
    (not in the transport's callback, where asyncio would only log it); the connection stays
    usable for whoever called ``serve`` (a node closes it)."""

    async def fail(served: Served, incs: list[Incoming]) -> bool:
        raise LocalError("the batch failed", reason="internal")

    async def main() -> None:
        served = Served(fail)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("x")
            ended = await served.outcome()
            assert isinstance(ended, LocalError) and "the batch failed" in str(ended)
            assert served.where == [True]
            assert served.conn is not None and not served.conn.closed
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_batch_that_returns_false_stops_the_reader(transport: str, sockdir: Path) -> None:
    async def stop(served: Served, incs: list[Incoming]) -> bool:
        return False

    async def main() -> None:
        served = Served(stop)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("first")
            assert await served.outcome() is None
            await client.send("second")  # nobody reads it: it stays queued, not handed out
            assert served.conn is not None
            await until(lambda: served.conn is not None and served.conn.received() == 1)
            assert served.got == ['"first"']
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_cancel_of_the_reader_reaches_a_batch_it_was_handed(transport: str, sockdir: Path) -> None:
    """The serving task is cancelled while it holds a batch that waits (handed over from the
    receive callback): the cancel is thrown into that batch (its cleanup runs), ``serve`` ends
    cancelled."""

    cleaned: list[str] = []

    async def hang(served: Served, incs: list[Incoming]) -> bool:
        try:
            await asyncio.get_running_loop().create_future()  # never done
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise
        return True

    async def main() -> None:
        served = Served(hang)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("x")
            await until(lambda: served.running)
            assert served.task is not None
            served.task.cancel()
            ended = await served.outcome()
            assert isinstance(ended, asyncio.CancelledError)
            assert cleaned == ["cancelled"] and served.where == [True]
        finally:
            await conn.close()
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_the_peer_closing_behind_a_waiting_batch_loses_no_frame(transport: str, sockdir: Path) -> None:
    """While a batch waits, the peer sends two more frames and closes: both are handed out after
    it, in order, then ``serve`` ends with the peer's close error."""

    gate: asyncio.Future[None]

    async def wait_once(served: Served, incs: list[Incoming]) -> bool:
        if len(served.where) == 1:
            await gate
        return True

    async def main() -> None:
        nonlocal gate
        gate = asyncio.get_running_loop().create_future()
        served = Served(wait_once)
        listener, conn, me = await pair(transport, sockdir, served)
        client = Client(conn, me)
        try:
            await client.send("a")
            await until(lambda: served.running)
            await client.send("b", "c")
            await conn.close(CloseCode.NO_ERROR, "bye")
            assert served.conn is not None
            await until(lambda: served.conn is not None and served.conn.closed)
            gate.set_result(None)
            ended = await served.outcome()
            assert isinstance(ended, ConnectionClosed) and "bye" in str(ended)
            assert served.got == ['"a"', '"b"', '"c"']
        finally:
            await listener.close()

    run(main())


# --- what it is for: loop turns per round trip -------------------------------------------------


class CountingSelector(selectors.DefaultSelector):
    """The loop's selector, counting its ``select`` calls: one per event-loop turn."""

    turns = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.turns += 1
        return super().select(timeout)


def _echo(ctx: Context) -> Any:
    return ctx.payload


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_round_trip_between_two_nodes_takes_three_loop_turns(transport: str, sockdir: Path) -> None:
    """A request and its reply at one in flight, both nodes on one loop, the handler inline:
    the requester's turn (its request written at once), the server's read (the handler runs and
    its reply is written in the receive callback), the client's read (the reply matched in its
    callback). As the floor (``iac/bench/contenders/floor.py``) does; a reader woken in a task
    per frame and a write left to the end of the turn made it six."""
    selector = CountingSelector()
    n = 50

    async def main() -> float:
        url = listen_url(transport, sockdir)
        bob = Node(listen=url, config=NodeConfig(sync_in_thread=False))
        bob.on("RUN")(_echo)
        alice = Node()
        async with bob, alice:
            alice.add_peer(bob.agent_id, *bob.addresses)
            for i in range(20):  # connected, sessions made, warm
                await alice.request(bob.agent_id, "RUN", i, timeout=WAIT)
            start = selector.turns
            for i in range(n):
                assert (await alice.request(bob.agent_id, "RUN", i, timeout=WAIT)).payload == i
            return (selector.turns - start) / n

    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        per_round_trip = runner.run(asyncio.wait_for(main(), 30))
    # (a node's periodic timers may add a turn now and then: not one per round trip)
    assert per_round_trip <= 3.25, per_round_trip
