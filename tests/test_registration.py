"""Registering handlers and callbacks: duplicates refused, every ``on_*`` undone by what it
returns, and the errors a caller's own mistakes get (a payload that is not JSON, a message too
large for a frame) name the fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import iac
from iac.errors import ProtocolError


def test_a_second_handler_for_a_type_is_refused_unless_replace() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:
            bob.on("RUN")(lambda ctx: "first")
            with pytest.raises(
                iac.ConfigError, match=r"RUN already has a handler \(.*lambda.*\); pass replace=True"
            ):
                bob.on(iac.MessageType.RUN)(lambda ctx: "second")
            alice.add_peer(bob.agent_id, *bob.addresses)
            assert (await alice.request(bob.agent_id, "RUN", timeout=5)).payload == "first"
            bob.on("RUN", replace=True)(lambda ctx: "third")
            assert (await alice.request(bob.agent_id, "RUN", timeout=5)).payload == "third"
            bob.on("PING")(lambda ctx: "pong")  # the node's own PING answer gives way without replace
            assert (await alice.request(bob.agent_id, "PING", timeout=5)).payload == "pong"
            with pytest.raises(iac.ConfigError, match="PING already has a handler"):
                bob.on("PING")(lambda ctx: "again")

    asyncio.run(main())


def test_a_second_function_under_an_exposed_name_is_refused_unless_replace() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:

            @bob.expose
            def add(a: int, b: int = 0) -> int:
                return a + b

            assert add(1, 2) == 3  # the function itself, unchanged
            with pytest.raises(
                iac.ConfigError, match=r"'add' is already exposed \(.*add\); pass replace=True"
            ):
                bob.expose(lambda a, b=0: a - b, name="add")
            alice.add_peer(bob.agent_id, *bob.addresses)
            assert await alice.call(bob.agent_id, "add", 2, b=3, timeout=5) == 5
            bob.expose("add", replace=True)(lambda a, b=0: a * b)
            assert await alice.call(bob.agent_id, "add", 2, b=3, timeout=5) == 6

    asyncio.run(main())


def test_every_on_returns_a_function_that_removes_the_callback(tmp_path: Path) -> None:
    async def main() -> None:
        config = iac.NodeConfig(inbox_dir=tmp_path / "inbox")
        async with iac.Node(listen="tls://127.0.0.1:0", config=config) as bob, iac.Node() as alice:
            removed: list[iac.ReceivedFile] = []
            kept: asyncio.Queue[iac.ReceivedFile] = asyncio.Queue()
            remove = bob.on_file(removed.append)  # registered first: it would be called first
            bob.on_file(kept.put_nowait)
            remove()
            remove()  # a second call does nothing
            for unsubscribe in (bob.on_error(lambda *a: None), bob.on_peer(lambda ev: None)):
                assert callable(unsubscribe)
                unsubscribe()
            (tmp_path / "a.txt").write_bytes(b"hello")
            alice.add_peer(bob.agent_id, *bob.addresses)
            await alice.send_file(bob.agent_id, tmp_path / "a.txt", timeout=10)
            got = await asyncio.wait_for(kept.get(), 5)
            assert got.name == "a.txt" and removed == []

    asyncio.run(main())


def test_a_payload_that_is_not_json_is_a_config_error_that_names_the_fix() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:
            bob.on("RUN")(lambda ctx: 1)
            alice.add_peer(bob.agent_id, *bob.addresses)
            fix = r"the payload is not JSON \(Object of type set.*\).*payload_json=.*send_file"
            with pytest.raises(iac.ConfigError, match=fix):
                await alice.send(bob.agent_id, "RUN", {1, 2})
            with pytest.raises(iac.ConfigError, match=fix):
                await alice.request(bob.agent_id, "RUN", {"ids": {1}}, timeout=5)
            with pytest.raises(iac.ConfigError, match=fix):
                await alice.broadcast("BROADCAST", {1})
            with pytest.raises(iac.ConfigError, match="the payload is not JSON"):
                async for _ in alice.stream(bob.agent_id, "RUN", b"bytes", timeout=5):
                    pass
            assert (await alice.request(bob.agent_id, "RUN", [1], timeout=5)).payload == 1  # still fine

    asyncio.run(main())


def test_a_message_too_large_for_a_frame_points_at_send_file_and_max_frame_size() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:
            bob.on("RUN")(lambda ctx: len(ctx.payload))
            alice.add_peer(bob.agent_id, *bob.addresses)
            big = "x" * (iac.NodeConfig().transport.max_frame_size + 1)
            with pytest.raises(
                ProtocolError, match=r"above max_frame_size \d+: .*Node.send_file.*max_frame_size"
            ) as exc_info:
                await alice.request(bob.agent_id, "RUN", big, timeout=5)
            assert exc_info.value.reason == "frame_too_large"
            assert (await alice.request(bob.agent_id, "RUN", "small", timeout=5)).payload == 5

    asyncio.run(main())
