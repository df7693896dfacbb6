"""``iac mcp serve --stdio`` and ``iac mcp connect`` as processes: a real stdio MCP server process
(tests/mcp_stdio_server.py) on the mesh, driven by the SDK's stdio client through ``iac mcp
connect``; one caller flooding the bridge while another is served; children that fail at start;
the remote agent going away under ``iac mcp connect``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path

import mcp_types as types
import pytest

pytest.importorskip("mcp")

from conftest import run
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from iac import Identity, Node
from iac.integrations import mcp as im
from iac.mesh.service import MeshClient, serve_registry

IAC = [sys.executable, "-m", "iac"]
SERVER = [sys.executable, str(Path(__file__).with_name("mcp_stdio_server.py"))]


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, sockdir: Path, *extra: str, child: list[str] = SERVER):
    key = tmp_path / "bridge.key"
    Identity.generate().save(key)
    cmd = ["mcp", "serve", "--key", str(key), "--listen", f"unix://{sockdir}/run/bridge.sock"]
    proc = await asyncio.create_subprocess_exec(
        *IAC, *cmd, *extra, "--stdio", "--", *child,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def ready(proc) -> dict[str, str]:
    seen: dict[str, str] = {}
    while "tools" not in seen:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        if not line:
            raise AssertionError((await proc.stderr.read()).decode())
        key, _, value = line.strip().partition(" ")
        seen.setdefault(key, value)
    return seen


def text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def connect_params(tmp_path: Path, seen: dict[str, str]) -> StdioServerParameters:
    key = tmp_path / "host.key"
    if not key.exists():
        Identity.generate().save(key)
    args = [
        "-m",
        "iac",
        "mcp",
        "connect",
        "--key",
        str(key),
        "--to",
        seen["node"],
        "--addr",
        seen["listening"],
    ]
    return StdioServerParameters(command=sys.executable, args=args)


def test_a_stdio_server_on_the_mesh_driven_through_iac_mcp_connect_until_the_agent_is_gone(tmp_path, sockdir):
    async def main():
        errlog = tmp_path / "connect.err"
        async with serving(tmp_path, sockdir) as bridge:
            seen = await ready(bridge)
            assert int(seen["tools"]) >= 6
            progress: list[float] = []

            async def on_progress(p, total, message):
                progress.append(p)

            with errlog.open("w") as err:
                async with (
                    stdio_client(connect_params(tmp_path, seen), errlog=err) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    init = await session.initialize()
                    assert init.server_info.name == "iac-test-tools"
                    assert "add" in {t.name for t in (await session.list_tools()).tools}
                    assert text(await session.call_tool("add", {"a": 20, "b": 22})) == "42"
                    counted = await session.call_tool("count", {"n": 3}, progress_callback=on_progress)
                    assert text(counted) == "counted 3"
                    read_back = await session.read_resource("res://greeting")
                    assert read_back.contents[0].text == "hello from the resource"
                    failed = await session.call_tool("fail", {"why": "bridge"})
                    assert failed.is_error and "failed: bridge" in text(failed)
                    assert errlog.read_text() == ""
                    # the agent goes away: every call is a JSON-RPC error, and one line is said
                    bridge.kill()
                    await bridge.wait()
                    for _ in range(2):
                        with pytest.raises(MCPError) as gone:
                            await session.call_tool("add", {"a": 1, "b": 1})
                        assert gone.value.error.code == im.UNREACHABLE
            assert progress == [1.0, 2.0, 3.0]
            lines = errlog.read_text().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("iac mcp connect: error: the remote agent"), lines

    run(main(), timeout=40)


def children(pid: int) -> set[int]:
    """The processes ``pid`` started (Linux)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(c) for c in path.read_text().split()} if path.exists() else set()


def test_one_caller_flooding_the_bridge_while_another_is_served(tmp_path, sockdir):
    """Also: the bridge registers itself (mcp/1, its tools, --capability) and stops its child."""

    async def main():
        async with Node(listen=[f"unix://{sockdir}/run/registry.sock"]) as registry:
            serve_registry(registry)
            reg = f"{registry.agent_id}@{registry.addresses[0]}"
            flags = ["--calls-per-peer", "2", "--calls-total", "4", "--registry", reg, "--capability", "fs"]
            async with serving(tmp_path, sockdir, *flags) as bridge:
                seen = await ready(bridge)
                (child,) = children(bridge.pid)  # the stdio MCP server
                await flood_while_served(seen, registry)
                bridge.send_signal(signal.SIGTERM)  # stops the child and the node, prints its counters
                out = (await asyncio.wait_for(bridge.stdout.read(), 10)).decode()
                assert await bridge.wait() == 0
                assert (
                    not Path(f"/proc/{child}").exists()
                    or "zombie" in Path(f"/proc/{child}/status").read_text()
                )
                stats = json.loads(out.strip().splitlines()[-1].removeprefix("stats "))
                assert stats["refused"] == {"busy": 4, "unknown_method": 1}
                assert stats["tools"] == {"block": 2, "add": 1}

    run(main(), timeout=40)


async def flood_while_served(seen: dict[str, str], registry: Node) -> None:
    async with Node() as flooder, Node() as polite:
        flooder.add_peer(seen["node"], seen["listening"])
        async with MeshClient(polite, registry.agent_id, registry.addresses, publish=False) as mesh:
            # found through the registry, by capability and by tool name
            assert await mesh.find("fs") == [seen["node"]]
            assert await im.find_tool(mesh, "add") == [seen["node"]]
        # a method that is not MCP's never reaches the child
        odd = {"mcp": "1", "session": "p" * 16, "message": {"jsonrpc": "2.0", "id": 1, "method": "x/y"}}
        (part,) = [p.payload async for p in polite.stream(seen["node"], "RUN", odd, timeout=10)]
        assert part["message"]["error"]["code"] == -32601
        async with (
            im.connect(flooder, seen["node"]) as (fr, fw),
            ClientSession(fr, fw) as flood,
            im.connect(polite, seen["node"]) as (pr, pw),
            ClientSession(pr, pw) as served,
        ):
            await flood.initialize()
            await served.initialize()
            calls = [asyncio.ensure_future(flood.call_tool("block", {})) for _ in range(6)]
            done: set[asyncio.Future] = set()
            pending = set(calls)
            while len(done) < 4:  # the bound answers at once: 4 of 6 refused, 2 held by the child
                more, pending = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
                assert more, "the bridge did not refuse the calls over the bound"
                done |= more
            assert [c.exception().error.code for c in done] == [im.BUSY] * 4 and len(pending) == 2
            # the other caller is served while the flooder holds its two
            assert text(await served.call_tool("add", {"a": 1, "b": 2})) == "3"
            assert all(not c.done() for c in pending)
            for c in pending:
                c.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def test_children_that_fail_at_start_are_one_line_and_exit_1(tmp_path, sockdir):
    cases = {
        "exit": "exited with code 3",
        "garbage": "not JSON-RPC",
        "mute": "did not answer initialize within 1 s",
    }

    async def one(how: str, says: str) -> None:
        child = [*SERVER, "--misbehave", how]
        timeout = "1" if how == "mute" else "10"
        here = tmp_path / how
        here.mkdir()
        (sockdir / how).mkdir()
        async with serving(here, sockdir / how, "--init-timeout", timeout, child=child) as bridge:
            code = await asyncio.wait_for(bridge.wait(), 20)
            err = (await bridge.stderr.read()).decode().strip().splitlines()
            assert code == 1
            assert len(err) == 1 and err[0].startswith("iac mcp serve: error:") and says in err[0], err

    async def main():
        await asyncio.gather(*(one(how, says) for how, says in cases.items()))

    run(main(), timeout=30)


def test_a_child_that_dies_mid_call_fails_the_call_and_the_bridge(tmp_path, sockdir):
    async def main():
        async with serving(tmp_path, sockdir) as bridge:
            seen = await ready(bridge)
            async with Node() as caller:
                caller.add_peer(seen["node"], seen["listening"])
                async with im.connect(caller, seen["node"]) as (r, w), ClientSession(r, w) as session:
                    await session.initialize()
                    with pytest.raises(MCPError) as failed:
                        await session.call_tool("crash", {"code": 5})
                    assert failed.value.error.code == im.UNREACHABLE
                    assert "exited with code 5" in str(failed.value)
            assert await asyncio.wait_for(bridge.wait(), 20) == 1
            err = (await bridge.stderr.read()).decode().strip().splitlines()
            assert err == ["iac mcp serve: error: the stdio MCP server exited with code 5"], err

    run(main(), timeout=30)
