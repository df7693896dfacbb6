"""One options type for sending: ``iac.SendOptions``, taken by every sending method as ``options=``
and shared between them; a keyword argument given beside it wins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import iac


def test_one_options_value_serves_every_sending_method() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:
            got: asyncio.Queue[object] = asyncio.Queue()
            never = asyncio.Event()

            @bob.on("RUN")
            def run(ctx: iac.Context) -> list[str]:
                return [ctx.principal, ctx.extra_data.hex()]

            @bob.on("CREATE")
            def event(ctx: iac.Context) -> None:
                got.put_nowait((ctx.principal, ctx.payload))

            @bob.on("DELEGATE_TASK")
            def take(ctx: iac.Context) -> list[str]:
                return [ctx.task.task_id, ctx.principal]

            @bob.on("TERMINATE")
            async def parts(ctx: iac.Context) -> AsyncIterator[str]:
                yield ctx.principal
                yield ctx.extra_data.decode()

            @bob.expose
            async def slow() -> None:
                await never.wait()

            alice.add_peer(bob.agent_id, *bob.addresses)
            opts = iac.SendOptions(principal="carol", extra_data=b"xy", timeout=5, ack=True)
            assert (await alice.request(bob.agent_id, "RUN", options=opts)).payload == ["carol", "7879"]
            # a keyword given beside the options wins over its field
            reply = await alice.request(bob.agent_id, "RUN", options=opts, principal="dave")
            assert reply.payload == ["dave", "7879"]
            sent = await alice.send(bob.agent_id, "CREATE", 1, options=opts)  # ack=True: wait for it
            await asyncio.wait_for(sent.wait(), 5)
            assert sent.acked and await asyncio.wait_for(got.get(), 5) == ("carol", 1)
            parts_seen = [p.payload async for p in alice.stream(bob.agent_id, "TERMINATE", options=opts)]
            assert parts_seen == ["carol", "xy"]
            task = iac.TaskState(task_id="t-1", intent=iac.Intent.ASSIGN_TASK, step=1, steps=1)
            assert (await alice.delegate(bob.agent_id, task, options=opts)).payload == ["t-1", "carol"]
            quick = iac.SendOptions(timeout=0.2)
            with pytest.raises(iac.RequestTimeout):
                await alice.call(bob.agent_id, "slow", options=quick)
            with pytest.raises(iac.RequestTimeout):
                await alice.invoke(bob.agent_id, "slow", options=quick)

    asyncio.run(main())


def test_merging_keeps_the_fields_and_takes_what_differs_from_the_defaults() -> None:
    opts = iac.SendOptions(sealed=True, via="ab" * 32, timeout=3)
    assert opts.merged(ack=False, timeout=None) is opts  # defaults given beside: nothing changes
    assert opts.merged(ack=True).ack and opts.merged(ack=True).sealed
    assert opts.merged(timeout=1).timeout == 1
