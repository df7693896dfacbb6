"""A received message is decided once: the receive pipeline (``iac/node/pipeline.py``) is entered
once per message on its way from the socket to the handler, and the dispatcher looks its handler
up once, when it admits the message. Counted over real round trips between two nodes on TLS."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest
from conftest import run

import iac.node.pipeline
from iac.errors import LocalError
from iac.node.config import NodeConfig
from iac.node.dispatch import Handler
from iac.node.node import Context, Node
from iac.node.store import StoreRunner

PIPELINE = iac.node.pipeline.__file__
ROUND_TRIPS = 5


@contextmanager
def entries_into(path: str) -> Iterator[Counter[str]]:
    """Count, on this thread, each call into a function of the module at ``path`` from outside
    it (a call within the module, or a coroutine of it resumed, is not another entry; a resumed
    coroutine is, as the module is entered again)."""
    found: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_filename != path:
            return
        back = frame.f_back
        if back is None or back.f_code.co_filename != path:
            found[frame.f_code.co_name] += 1

    assert sys.getprofile() is None, "another profiler is installed"
    sys.setprofile(profile)
    try:
        yield found
    finally:
        sys.setprofile(None)


class CountingHandlers(dict[int, Handler]):
    """A handler table that counts its lookups."""

    def __init__(self, table: dict[int, Handler]) -> None:
        super().__init__(table)
        self.lookups = 0

    def get(self, key: int, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def _echo(ctx: Context) -> Any:
    return ctx.payload


async def _round_trips(alice: Node, bob: Node, ack: bool) -> None:
    for i in range(ROUND_TRIPS):
        if ack:
            sent = await alice.send(bob.agent_id, "RUN", i, ack=True)
            await asyncio.wait_for(sent.wait(), 5)
        else:
            assert (await alice.request(bob.agent_id, "RUN", i, timeout=5)).payload == i


def _pair(handler: Callable[[Context], Any]) -> tuple[Node, Node]:
    # sync_in_thread=False: the handler runs right in the read loop, so the whole path from the
    # socket to the handler and back is on the counted thread.
    bob = Node(listen="tls://127.0.0.1:0", config=NodeConfig(sync_in_thread=False))
    bob.on("RUN")(handler)
    return Node(), bob


def test_the_pipeline_is_entered_once_per_received_message() -> None:
    async def main() -> None:
        alice, bob = _pair(_echo)
        async with bob, alice:
            alice.add_peer(bob.agent_id, *bob.addresses)
            await _round_trips(alice, bob, ack=False)  # connected, sessions made
            for ack in (False, True):  # REPLY answers, then ACK answers
                received = bob.stats().received + alice.stats().received
                with entries_into(PIPELINE) as entries:
                    await _round_trips(alice, bob, ack)
                messages = bob.stats().received + alice.stats().received - received
                assert messages == 2 * ROUND_TRIPS  # each request or message, and its answer
                assert dict(entries) == {"receive": messages}

    run(main())


def test_the_handler_is_looked_up_once_per_message_at_admission() -> None:
    async def main() -> None:
        alice, bob = _pair(_echo)
        async with bob, alice:
            table = CountingHandlers(bob._dispatch.handlers)
            bob._dispatch.handlers = table
            alice.add_peer(bob.agent_id, *bob.addresses)
            await _round_trips(alice, bob, ack=False)
            await _round_trips(alice, bob, ack=True)
            assert table.lookups == 2 * ROUND_TRIPS

    run(main())


def test_the_counter_sees_entries() -> None:
    """The profiler counts what it should: a call from outside, not one within the module."""
    with entries_into(PIPELINE) as entries:
        iac.node.pipeline.ReceivePipeline._stale  # noqa: B018 - an attribute read is no call
        iac.node.pipeline.Route(0)
    assert entries == Counter()
    store = StoreRunner()
    pipe = iac.node.pipeline.ReceivePipeline(Node().identity, NodeConfig(), store)
    with entries_into(PIPELINE) as entries, pytest.raises(LocalError, match="not started"):
        asyncio.run(pipe.receive(None, [], 0))  # type: ignore[arg-type]  # the store is not open
    assert entries == Counter({"receive": 1})
