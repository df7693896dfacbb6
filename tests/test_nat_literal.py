"""NAT punch candidates are IP literals only: a host name is refused and counted, and no name
lookup ever runs on the event loop (a resolver that never answers cannot stall a node)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run

from iac.errors import HandlerError, RemoteError
from iac.mesh.nat import check_candidates
from iac.node.node import Node
from iac.testing.nat import in_namespace, unavailable
from iac.testing.nat import run as sh
from iac.wire.enums import MessageType

HERE = Path(__file__).parent
#: Host-name candidates, as an attacker sends them: each one a lookup the victim must not make.
NAMES = [["observed", "quic://punch-a.example:4433"], ["local", "quic://punch-b.example:4433"]]


def test_check_candidates_takes_ip_literals_only() -> None:
    ok = [["observed", "quic://203.0.113.7:4433"], ["local", "quic://[2001:db8::1]:4433"]]
    assert check_candidates(ok) == [tuple(c) for c in ok]
    for name in (["local", "quic://localhost:4433"], ["observed", "quic://punch-a.example:1"]):
        with pytest.raises(HandlerError, match="names a host, not an IP address") as err:
            check_candidates([name])
        assert err.value.code == "bad_request"


@contextlib.contextmanager
def silent_resolver() -> Iterator[str]:
    """A network namespace whose resolver (127.0.0.1:53, as ``ip netns exec`` shows it to a
    process) takes queries and never answers: every lookup waits out its timeout (10 s)."""
    ns = f"iacdns{os.getpid()}"
    etc = Path("/etc/netns") / ns
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "set", "lo", "up", ns=ns)
        etc.mkdir(parents=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        with in_namespace(ns):
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sink:
            sink.bind(("127.0.0.1", 53))
            yield ns
    finally:
        shutil.rmtree(etc, ignore_errors=True)
        with contextlib.suppress(OSError):
            etc.parent.rmdir()
        sh("ip", "netns", "del", ns, check=False)


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_host_name_punches_never_stall_the_node_behind_a_silent_resolver() -> None:
    with silent_resolver() as ns:
        victim = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(HERE / "punch_victim.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert victim.stdin is not None and victim.stdout is not None
        try:
            hello = json.loads(victim.stdout.readline())

            async def main() -> None:
                attacker = Node(listen=["quic://127.0.0.1:0"])
                honest = Node(listen=["quic://127.0.0.1:0"])
                for node in (attacker, honest):
                    with in_namespace(ns):
                        await node.start()
                        node.add_peer(hello["agent_id"], hello["url"])
                        await node.connect(hello["agent_id"])
                try:

                    async def punch() -> str:
                        try:
                            await attacker.request(
                                hello["agent_id"], MessageType.REGISTER_KEY,
                                {"op": "punch", "candidates": NAMES}, timeout=15.0,
                            )  # fmt: skip
                        except RemoteError as exc:
                            return exc.code
                        return "answered"

                    async def ask(i: int) -> float:
                        loop = asyncio.get_running_loop()
                        start = loop.time()
                        peer = hello["agent_id"]
                        reply = await honest.request(peer, MessageType.RUN, {"i": i}, timeout=5.0)
                        assert reply.payload == {"i": i}
                        return loop.time() - start

                    attack = [asyncio.ensure_future(punch()) for _ in range(4)]
                    took = []
                    for i in range(6):  # while the punches are in flight, one after the other
                        took.append(await ask(i))
                    results = await asyncio.gather(*attack)
                    assert results == ["bad_request"] * 4
                    assert max(took) < 5.0, took
                finally:
                    await attacker.close()
                    await honest.close()

            run(main())
            victim.stdin.write("stats\n")
            victim.stdin.flush()
            stats = json.loads(victim.stdout.readline())
            assert stats["host_names"] == 4 and stats["punch_datagrams"] == 0
        finally:
            victim.stdin.close()
            try:
                victim.wait(timeout=10)
            except subprocess.TimeoutExpired:
                victim.kill()
                victim.wait()
