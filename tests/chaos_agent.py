"""One node process of the chaos tests (tests/test_chaos.py): killed with SIGKILL, started again,
put behind the link emulator.

Run as ``python tests/chaos_agent.py '<json settings>'``. Settings:

* ``seed``: the identity's 32-byte seed, hex (a restarted process keeps its AgentId).
* ``listen``: URLs to listen on (default none).
* ``store``: the replay store: ``{"kind": "memory"}`` (default), ``{"kind": "sqlite", "path": ...}``
  or ``{"kind": "redis", "url": ..., "prefix": ...}`` (SQLite: ``synchronous`` optional).
* ``config``: NodeConfig fields (numbers and strings only, e.g. ``delivery_timeout``).
* ``log``: a file to which the RUN handler appends ``<i> <session_id hex> <msg_id> <pid>``, one
  line per handled message, with one ``write`` on an ``O_APPEND`` descriptor (what reached the
  file survives a SIGKILL of this process).
* ``acks``: a file to which each acknowledged message is appended the same way (sending side).
* ``peers``: ``{agent_id: [url, ...]}`` for the peer book.
* ``hang``: items whose handler never finishes (it waits before it writes its line).

It speaks JSON lines. First it prints ``{"id": ..., "addrs": [...], "pid": ...}``; then it reads
commands on stdin and answers each with one line:

* ``{"cmd": "send", "to": id, "items": [i, ...], "ordered": true}``: send RUN ``{"i": i}`` for
  each item with ACK_REQUESTED (and ORDERED), in order; answers ``{"queued": n}`` once every one
  was handed to the node, and later ``{"settled": {"acked": [...], "failed": {i: error name}}}``.
* ``{"cmd": "request", "to": id, "timeout": s}``: a plain PING request; answers ``{"reply": true}`` or
  ``{"error": <error class name>, "seconds": ...}``.
* ``{"cmd": "stats"}``: ``{"stats": {...}}`` (the node's counters).
* ``{"cmd": "quit"}``: closes the node, answers ``{"bye": true}`` and exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from typing import Any

from iac import Context, Identity, MessageType, Node, NodeConfig
from iac.protocol.replay import ReplayConfig, ReplayStore


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class AppendLog:
    """Lines appended with one ``write`` each (no buffering in this process to lose)."""

    def __init__(self, path: str | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if path else None

    def add(self, *fields: object) -> None:
        if self._fd is not None:
            os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())


def make_store(spec: dict[str, Any], config: NodeConfig) -> ReplayStore | None:
    kind = spec.get("kind", "memory")
    rc = ReplayConfig(config.replay_window, config.transport.max_skew_us, config.max_sessions)
    if kind == "sqlite":
        from iac.stores import SqliteReplayStore

        sync = spec.get("synchronous", "FULL")
        return SqliteReplayStore(spec["path"], rc, synchronous=sync)
    if kind == "redis":
        from iac.stores import RedisReplayStore

        return RedisReplayStore(spec["url"], rc, key_prefix=spec["prefix"])
    return None


def stats_of(node: Node) -> dict[str, Any]:
    st = dataclasses.asdict(node.stats())
    return {k: v for k, v in st.items() if k not in ("peer_links",)}


async def main(settings: dict[str, Any]) -> None:
    identity = Identity.from_seed(bytes.fromhex(settings["seed"]))
    config = NodeConfig(sync_in_thread=False, **settings.get("config", {}))
    store = make_store(settings.get("store", {}), config)
    handled = AppendLog(settings.get("log"))
    acked = AppendLog(settings.get("acks"))
    pid = os.getpid()
    peers = {k: list(v) for k, v in settings.get("peers", {}).items()}
    async with Node(
        identity, listen=settings.get("listen", []), config=config, replay_store=store, peers=peers
    ) as node:
        hang = set(settings.get("hang", []))

        @node.on(MessageType.RUN)
        async def on_run(ctx: Context) -> str:
            msg = ctx.message
            if ctx.payload["i"] in hang:  # a handler still running when the process is killed
                await asyncio.Event().wait()
            handled.add(ctx.payload["i"], f"{msg.session_id:016x}", msg.msg_id, pid)
            return "ok"

        emit({"id": node.agent_id, "addrs": node.addresses, "pid": pid})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        background: set[asyncio.Task[None]] = set()

        async def settle(sent: list[tuple[int, Any]]) -> None:
            ok: list[int] = []
            failed: dict[int, str] = {}
            for i, s in sent:
                try:
                    await s.wait()
                except Exception as exc:
                    failed[i] = type(exc).__name__
                else:
                    ok.append(i)
            emit({"settled": {"acked": ok, "failed": failed}})

        async def send(cmd: dict[str, Any]) -> None:
            sent = []
            for i in cmd["items"]:
                s = await node.send(
                    cmd["to"], MessageType.RUN, {"i": i}, ack=True, ordered=cmd.get("ordered", True)
                )
                sent.append((i, s))
                # each ACK is recorded as it comes, not only when all are in
                task = asyncio.ensure_future(_record_when_acked(s, i))
                background.add(task)
                task.add_done_callback(background.discard)
            emit({"queued": len(sent)})
            await settle(sent)

        async def _record_when_acked(s: Any, i: int) -> None:
            try:
                await s.wait()
            except Exception:
                return
            acked.add(i, f"{s.session_id:016x}", s.msg_id, pid)

        while line := await reader.readline():
            cmd = json.loads(line)
            match cmd["cmd"]:
                case "send":
                    task = asyncio.ensure_future(send(cmd))
                    background.add(task)
                    task.add_done_callback(background.discard)
                case "request":
                    t0 = time.monotonic()
                    try:
                        await node.request(cmd["to"], MessageType.PING, timeout=cmd["timeout"])
                    except Exception as exc:
                        emit({"error": type(exc).__name__, "seconds": time.monotonic() - t0})
                    else:
                        emit({"reply": True, "seconds": time.monotonic() - t0})
                case "stats":
                    emit({"stats": stats_of(node)})
                case "quit":
                    break
    emit({"bye": True})


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
