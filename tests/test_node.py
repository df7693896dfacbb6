"""iac.Node: handlers, request/reply, remote calls, task hand-offs, deadlines, cancel, sealing, events."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from conftest import run

from iac.errors import ConfigError, HandlerError, RemoteError, RequestTimeout, TransportError
from iac.node.config import NodeConfig, PeerEvent, Topology
from iac.node.node import Context, Node
from iac.testing import eventually, node_pair
from iac.wire._pb.iac_pb2 import Intent, MessageType, TaskState
from iac.wire.identity import Identity

HERE = Path(__file__).resolve().parent


def task(step: int = 1, steps: int = 3, intent: int = Intent.ASSIGN_TASK) -> TaskState:
    return TaskState(task_id="t-1", intent=intent, step=step, steps=steps, state_ref="kv://tasks/t-1")  # type: ignore[arg-type]


@pytest.mark.parametrize("transport", ["tls", "unix", "quic"])
def test_request_reply_over_each_transport(transport: str) -> None:
    async def main() -> None:
        async with node_pair(transport) as (alice, bob):

            @bob.on(MessageType.RUN)
            async def echo(ctx: Context) -> object:
                return {"echo": ctx.payload, "from": ctx.sender}

            reply = await alice.request(bob.agent_id, MessageType.RUN, {"x": 1}, timeout=5)
            assert reply.payload == {"echo": {"x": 1}, "from": alice.agent_id}
            assert reply.sender == bob.agent_id
            st = bob.stats()
            assert st.handled == 1 and st.replies_sent == 1 and st.refused == {}

    run(main())


def test_handler_error_and_internal_error() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):

            @bob.on(MessageType.RUN)
            def handler(ctx: Context) -> object:
                if ctx.payload == "deny":
                    raise HandlerError("unauthorized", "not you")
                raise RuntimeError("secret detail")

            with pytest.raises(RemoteError) as e1:
                await alice.request(bob.agent_id, MessageType.RUN, "deny", timeout=5)
            assert e1.value.code == "unauthorized" and e1.value.message == "not you"
            with pytest.raises(RemoteError) as e2:
                await alice.request(bob.agent_id, MessageType.RUN, "boom", timeout=5)
            assert e2.value.code == "internal" and "secret" not in e2.value.message
            assert alice.stats().errors_received == {"unauthorized": 1, "internal": 1}

    run(main())


def test_handler_error_refuses_unknown_code() -> None:
    with pytest.raises(ConfigError):
        HandlerError("teapot")


def test_no_handler() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            with pytest.raises(RemoteError) as e:
                await alice.request(bob.agent_id, MessageType.CREATE, {}, timeout=5)
            assert e.value.code == "no_handler"
            assert bob.stats().refused == {"no_handler": 1}

    run(main())


def test_ping_is_answered_by_default() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            reply = await alice.request(bob.agent_id, MessageType.PING, timeout=5)
            assert reply.payload is None

    run(main())


def test_on_refuses_node_owned_types() -> None:
    node = Node()
    for mt in (
        MessageType.REPLY,
        MessageType.ERROR,
        MessageType.ACK,
        MessageType.CANCEL,
        MessageType.COMMAND,
    ):
        with pytest.raises(ConfigError):
            node.on(mt)


# --- remote calls -------------------------------------------------------------------------------


def test_remote_call_sync_and_async_on_allow_list() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            main_thread = threading.get_ident()
            seen_threads: list[int] = []

            @bob.expose
            def add(a: int, b: int = 0) -> int:
                seen_threads.append(threading.get_ident())
                return a + b

            @bob.expose("summarize")
            async def summary(text: str, *, words: int = 3) -> str:
                return " ".join(text.split()[:words])

            bob.expose(len, name="length")
            assert bob.exposed == ["add", "length", "summarize"]
            assert await alice.call(bob.agent_id, "add", 2, b=3) == 5
            assert seen_threads and seen_threads[0] != main_thread  # sync functions run in a thread
            assert await alice.call(bob.agent_id, "summarize", "a b c d e", words=2) == "a b"
            assert await alice.call(bob.agent_id, "length", [1, 2, 3]) == 3
            assert await alice.invoke(bob.agent_id, "add", [1], {"b": 1}, timeout=5) == 2

    run(main())


def test_remote_call_unknown_name_is_no_handler_and_nothing_is_looked_up() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            bob.expose(lambda: "ok", name="safe")
            for name in ("os.system", "__import__", "eval", "safe.__globals__", "Node"):
                with pytest.raises(RemoteError) as e:
                    await alice.call(bob.agent_id, name, "echo pwned")
                assert e.value.code == "no_handler"
            assert bob.stats().refused["no_handler"] == 5

    run(main())


def test_remote_call_bad_arguments_is_bad_request() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            bob.expose(lambda a: a, name="one")
            with pytest.raises(RemoteError) as e:
                await alice.call(bob.agent_id, "one", 1, 2)
            assert e.value.code == "bad_request"
            with pytest.raises(RemoteError) as e:
                await alice.request(bob.agent_id, MessageType.COMMAND, {"name": 5}, timeout=5)
            assert e.value.code == "bad_request"
            assert bob.stats().refused == {"bad_call": 2}

    run(main())


# --- task hand-offs -----------------------------------------------------------------------------


def test_delegate_task_envelope_is_checked_before_the_handler_wakes() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            woke: list[TaskState] = []

            @bob.on(MessageType.DELEGATE_TASK)
            def take(ctx: Context) -> object:
                assert ctx.task is not None
                woke.append(ctx.task)
                return {"accepted": ctx.task.task_id, "state_ref": ctx.task.state_ref}

            reply = await alice.delegate(bob.agent_id, task(2, 3), {"goal": "x"}, timeout=5)
            assert reply.payload == {"accepted": "t-1", "state_ref": "kv://tasks/t-1"}
            bad = [
                task(0, 3),
                task(4, 3),
                task(1, 0),
                task(1, 3, intent=Intent.INTENT_UNSPECIFIED),
                task(1, 3, intent=99),
            ]
            for t in bad:
                with pytest.raises(RemoteError) as e:
                    await alice.delegate(bob.agent_id, t, timeout=5)
                assert e.value.code == "bad_request"
            with pytest.raises(RemoteError) as e:  # DELEGATE_TASK without an envelope
                await alice.request(bob.agent_id, MessageType.DELEGATE_TASK, {}, timeout=5)
            assert e.value.code == "bad_request"
            assert len(woke) == 1
            assert bob.stats().refused == {"bad_task": 6}

    run(main())


def test_delegate_sender_allow_list() -> None:
    async def main() -> None:
        stranger = Identity.generate()
        cfg = NodeConfig(delegators=frozenset({stranger.agent_id}))
        async with node_pair("tls", server_config=cfg) as (alice, bob):
            bob.on(MessageType.DELEGATE_TASK)(lambda ctx: "yes")
            with pytest.raises(RemoteError) as e:
                await alice.delegate(bob.agent_id, task(), timeout=5)
            assert e.value.code == "unauthorized"
            assert bob.stats().refused == {"delegation_denied": 1}

    run(main())


def test_delegate_falls_back_when_the_first_does_not_answer_in_time() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, slow), Node(listen=["tls://127.0.0.1:0"]) as backup:
            alice.add_peer(backup.agent_id, *backup.addresses)
            release = asyncio.Event()
            cancelled = asyncio.Event()

            @slow.on(MessageType.DELEGATE_TASK)
            async def stuck(ctx: Context) -> object:
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
                return "slow"

            backup.on(MessageType.DELEGATE_TASK)(lambda ctx: "backup")
            reply = await alice.delegate(slow.agent_id, task(), timeout=0.3, fallback=backup.agent_id)
            assert reply.payload == "backup" and reply.sender == backup.agent_id
            await asyncio.wait_for(cancelled.wait(), 5)  # its deadline (or the CANCEL) stopped it

    run(main())


def test_delegate_falls_back_when_the_first_is_unreachable() -> None:
    async def main() -> None:
        async with Node() as alice, Node(listen=["tls://127.0.0.1:0"]) as backup:
            gone = Identity.generate().agent_id
            alice.add_peer(gone, "tls://127.0.0.1:1")
            alice.add_peer(backup.agent_id, *backup.addresses)
            backup.on(MessageType.DELEGATE_TASK)(lambda ctx: "backup")
            reply = await alice.delegate(gone, task(), timeout=2, fallback=[backup.agent_id])
            assert reply.payload == "backup"

    run(main())


# --- deadlines and cancellation -------------------------------------------------------------------


def test_handler_sees_its_deadline_and_is_cut_off_at_it() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            seen: list[float | None] = []

            @bob.on(MessageType.RUN)
            async def slow(ctx: Context) -> object:
                seen.append(ctx.time_left())
                await asyncio.sleep(10)
                return "late"

            with pytest.raises((RequestTimeout, RemoteError)) as e:  # whichever side's clock fires first
                await alice.request(bob.agent_id, MessageType.RUN, timeout=0.3)
            assert isinstance(e.value, RequestTimeout) or e.value.code == "timeout"
            assert seen and seen[0] is not None and 0 < seen[0] <= 0.3

    run(main())


def test_cancel_reaches_the_callee_handler() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            started, cancelled = asyncio.Event(), asyncio.Event()

            @bob.on(MessageType.RUN)
            async def long(ctx: Context) -> object:
                started.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
                return None

            req = asyncio.ensure_future(alice.request(bob.agent_id, MessageType.RUN, timeout=20))
            await asyncio.wait_for(started.wait(), 5)
            req.cancel()
            with pytest.raises(asyncio.CancelledError):
                await req
            await asyncio.wait_for(cancelled.wait(), 5)
            await eventually(lambda: bob.stats().cancelled, message=lambda: f"{bob.stats()}")
            assert bob.stats().cancelled == 1
            assert bob.stats().errors_sent == {"cancelled": 1}

    run(main())


def test_request_past_its_deadline_is_not_started() -> None:
    async def main() -> None:
        cfg = NodeConfig(max_handlers=1)
        async with node_pair("tls", server_config=cfg) as (alice, bob):
            gate, blocking = asyncio.Event(), asyncio.Event()
            ran: list[object] = []

            @bob.on(MessageType.RUN)
            async def handler(ctx: Context) -> object:
                ran.append(ctx.payload)
                if ctx.payload == "block":
                    blocking.set()
                    await gate.wait()
                return ctx.payload

            blocker = asyncio.ensure_future(alice.request(bob.agent_id, MessageType.RUN, "block", timeout=10))
            await asyncio.wait_for(blocking.wait(), 5)  # the only handler slot is taken
            with pytest.raises(RequestTimeout):  # waits for the only slot, its deadline passes
                await alice.request(bob.agent_id, MessageType.RUN, "queued", timeout=0.2)
            gate.set()
            assert (await blocker).payload == "block"
            assert ran == ["block"]
            assert bob.stats().refused.get("deadline_passed") == 1

    run(main())


# --- sealing -------------------------------------------------------------------------------------


def test_sealed_request_and_reply() -> None:
    async def main() -> None:
        async with node_pair("tls") as (alice, bob):
            seen: list[bytes] = []

            @bob.on(MessageType.RUN)
            def handler(ctx: Context) -> object:
                seen.append(ctx.extra_data)
                return {"secret": ctx.payload["secret"][::-1]}

            reply = await alice.request(
                bob.agent_id, MessageType.RUN, {"secret": "abc"}, sealed=True, extra_data=b"x", timeout=5
            )
            assert reply.payload == {"secret": "cba"}
            assert seen == [b"x"]

    run(main())


# --- topology, peer events, drain, stats -----------------------------------------------------------


def test_topology_allow_list() -> None:
    async def main() -> None:
        alice_id, carol_id = Identity.generate(), Identity.generate()
        async with Node(listen=["tls://127.0.0.1:0"]) as bob_probe:
            bob_id = bob_probe.identity
        topo = Topology([(alice_id.agent_id, bob_id.agent_id)])
        async with (
            Node(bob_id, listen=["tls://127.0.0.1:0"], config=NodeConfig(topology=topo)) as bob,
            Node(alice_id) as alice,
            Node(carol_id) as carol,
        ):
            bob.on(MessageType.RUN)(lambda ctx: "hi")
            for n in (alice, carol):
                n.add_peer(bob.agent_id, *bob.addresses)
            assert (await alice.request(bob.agent_id, MessageType.RUN, timeout=5)).payload == "hi"
            with pytest.raises(RemoteError) as e:
                await carol.request(bob.agent_id, MessageType.RUN, timeout=5)
            assert e.value.code == "policy_denied"
            assert bob.stats().refused == {"policy_denied": 1}

    run(main())


def test_peer_events_and_graceful_drain() -> None:
    async def main() -> None:
        events: list[PeerEvent] = []
        bob = Node(listen=["tls://127.0.0.1:0"], config=NodeConfig(drain_timeout=5))
        await bob.start()
        bob.on_peer(events.append)
        running, release = asyncio.Event(), asyncio.Event()
        finished: list[str] = []

        @bob.on(MessageType.RUN)
        async def handler(ctx: Context) -> object:
            running.set()
            await release.wait()
            finished.append("handler")
            return "finished"

        async with Node() as alice:
            alice_events: list[PeerEvent] = []
            alice.on_peer(alice_events.append)
            alice.add_peer(bob.agent_id, *bob.addresses)
            req = asyncio.ensure_future(alice.request(bob.agent_id, MessageType.RUN, timeout=5))
            await asyncio.wait_for(running.wait(), 5)
            closing = asyncio.ensure_future(bob.close())
            # Callbacks run in order: close() has begun (and is draining) before the handler may go on.
            asyncio.get_running_loop().call_soon(release.set)
            assert (await req).payload == "finished"  # drain: the running handler finished and answered
            await closing
            assert finished == ["handler"]
            await eventually(lambda: len(alice_events) == 2, message=lambda: f"{alice_events}")
            assert [e.up for e in alice_events] == [True, False]
            assert [e.up for e in events] == [True, False]
            with pytest.raises(TransportError):
                await alice.request(bob.agent_id, MessageType.RUN, timeout=1)

    run(main())


def test_peer_events_async_iterator() -> None:
    async def main() -> None:
        async with node_pair("tls", connect=False) as (alice, bob):
            events = alice.peer_events()
            # The reader task is scheduled before the request dials, so it is subscribed before any
            # connection (and its peer event) can exist: no yield needed in between.
            nxt = asyncio.ensure_future(events.__anext__())
            await alice.request(bob.agent_id, MessageType.PING, timeout=5)
            ev = await asyncio.wait_for(nxt, 5)
            assert ev.agent_id == bob.agent_id and ev.up and ev.transport == "tls"
            await events.aclose()

    run(main())


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        NodeConfig(max_in_flight=1024)
    with pytest.raises(ConfigError):
        NodeConfig(delivery_timeout=61)
    with pytest.raises(ConfigError):
        NodeConfig(replay_window=100)


def test_send_before_start_is_a_local_error() -> None:
    from iac.errors import LocalError

    async def main() -> None:
        node = Node()
        with pytest.raises(LocalError):
            await node.send(Identity.generate().agent_id, MessageType.RUN)

    run(main())
