"""``iac a2a gateway``, ``bridge`` and ``card`` as processes, with the stock a2a-sdk client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

import pytest

pytest.importorskip("a2a")

import httpx
from a2a.types import Role
from conftest import run
from test_a2a_gateway import stock_client
from test_a2a_support import TOKEN, Worker, card, handler, http_agent, texts, user_message

from iac import Identity, Node
from iac.integrations import a2a as ia

IAC = [sys.executable, "-m", "iac"]


@contextlib.asynccontextmanager
async def process(*args: str):
    proc = await asyncio.create_subprocess_exec(
        *IAC, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
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


async def lines_until(proc, prefix: str) -> dict[str, str]:
    seen: dict[str, str] = {}
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        if not line:
            raise AssertionError((await proc.stderr.read()).decode())
        key, _, value = line.strip().partition(" ")
        seen.setdefault(key, value)
        if key == prefix:
            return seen


def test_the_gateway_command(tmp_path):
    key = tmp_path / "gw.key"
    Identity.generate().save(key)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# principal token\nalice {TOKEN}\n")
    os.chmod(tokens, 0o600)

    async def main():
        worker = Worker()
        agent_card = card()
        async with Node(listen=["tls://127.0.0.1:0"]) as agent:
            gw_id = Identity.load(key).agent_id
            ia.serve(agent, handler(worker, agent_card), agent_card, trusted_gateways=[gw_id])
            addr = ["--to", agent.agent_id, "--addr", agent.addresses[0]]
            cmd = ["a2a", "gateway", "--key", str(key), "--listen", "http://127.0.0.1:0"]
            cmd += ["--tokens", str(tokens)]
            async with process(*cmd, *addr) as gw:
                seen = await lines_until(gw, "node")
                assert seen["node"] == gw_id and seen["card"].endswith("/.well-known/agent-card.json")
                async with httpx.AsyncClient() as http:
                    client, ctx = await stock_client(http, seen["gateway"])
                    events = [e async for e in client.send_message(user_message("hello"), context=ctx)]
                    # an A2A 0.3 call: no A2A-Version header, a 0.3 method name
                    msg = {"kind": "message", "role": "user", "messageId": "m-cli-03",
                           "parts": [{"kind": "text", "text": "hello"}]}  # fmt: skip
                    body = {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {"message": msg}}
                    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as plain:
                        r = await plain.post(seen["gateway"], json=body)  # a client of its own: no header
                    assert "result" in r.json(), r.text
                    assert [p["text"] for p in r.json()["result"]["parts"]] == ["hi alice"]
                assert texts(events) == ["hi alice"] and worker.users[-1].agent_id == gw_id
                gw.send_signal(signal.SIGTERM)
                stats = await lines_until(gw, "stats")
                forwarded = json.loads(stats["stats"])["forwarded"]
                assert forwarded == {"SendStreamingMessage": 1, "SendMessage": 1}
                assert await gw.wait() == 0
            async with process("a2a", "card", "--key", str(key), *addr) as proc:
                out, _ = await proc.communicate()
                assert json.loads(out)["name"] == "worker"
            # a world-readable token file, and an agent that is not the one named: one line, exit 1
            os.chmod(tokens, 0o644)
            async with process(*cmd, *addr) as proc:
                _, err = await proc.communicate()
                assert proc.returncode == 1 and b"chmod 600" in err
            os.chmod(tokens, 0o600)
            wrong = ["--to", Identity.generate().agent_id, "--addr", agent.addresses[0]]
            async with process(*cmd, *wrong, "--timeout", "5") as proc:
                _, err = await proc.communicate()
                assert proc.returncode == 1 and err.count(b"\n") == 1 and b"wrong_peer" in err, err

    run(main(), timeout=90)


def test_the_bridge_command(tmp_path):
    key = tmp_path / "bridge.key"
    Identity.generate().save(key)

    async def main():
        worker = Worker()
        async with http_agent(worker) as (url, _), Node() as me:
            cmd = ["a2a", "bridge", "--key", str(key), "--listen", "tls://127.0.0.1:0", "--to", url]
            async with process(*cmd) as bridge:
                seen = await lines_until(bridge, "bridging")
                got = await ia.fetch_card(me, seen["node"], seen["listening"])
                sent = await ia.client(me, got).send_message(user_message("hello")).__anext__()
                assert sent.message.role == Role.ROLE_AGENT and texts([sent]) == ["hi "]

    run(main(), timeout=60)
