"""The link emulator's ``mtu`` (iac.testing.netem) under a real QUIC file transfer between two
processes in two network namespaces: path MTU discovery raises the path to 1,472 bytes (the
TUN devices carry 1,500), the test lowers the emulator's MTU to 1,280 in the middle of the
transfer, and the sender's path falls back to 1,200 bytes within 3 probe timeouts of noticing
the loss while the file arrives intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iac.testing import Impairment, netem
from iac.testing.waiting import eventually_sync
from iac.transport.quic.pmtud import BASE_PLPMTU, MAX_PROBES

PORT = 9011

_RECEIVER = textwrap.dedent(
    f"""
    import asyncio, sys
    from iac.node.config import NodeConfig
    from iac.node.node import Node

    async def main() -> None:
        config = NodeConfig(inbox_dir=sys.argv[1])
        async with Node(listen=["quic://{netem.ADDR_B}:{PORT}"], config=config) as rx:
            print(rx.agent_id, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())
    """
)

_SENDER = textwrap.dedent(
    f"""
    import asyncio, dataclasses, json, sys
    from iac.node.node import Node
    from iac.testing import eventually

    async def main() -> None:
        peer, path = sys.argv[1], sys.argv[2]
        async with Node() as tx:
            tx.add_peer(peer, "quic://{netem.ADDR_B}:{PORT}")
            await tx.connect(peer)
            pmtu = tx.connection(peer).path_mtu
            await eventually(lambda: pmtu.mtu == 1472, timeout=10)
            print("raised", flush=True)
            res = await tx.send_file(peer, path, timeout=30)
            print(json.dumps({{"sha256": res.sha256, "changes": pmtu.changes,
                              "stats": dataclasses.asdict(pmtu.path.stats)}}), flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.skipif(netem.unavailable() is not None, reason=f"link emulator: {netem.unavailable()}")
def test_emulator_mtu_drop_mid_transfer_falls_back_and_the_file_arrives(tmp_path: Path) -> None:
    import hashlib

    size = 4 << 20
    data = os.urandom(size)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    inbox = tmp_path / "inbox"
    with netem.Link(Impairment(delay=0.002), tag=f"m{os.getpid() % 100000}") as link:
        rx = link.popen("b", [sys.executable, "-c", _RECEIVER, str(inbox)], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert rx.stdout is not None and rx.stdin is not None
        peer = rx.stdout.readline().strip()
        tx = link.popen(
            "a", [sys.executable, "-c", _SENDER, peer, str(src)], stdout=subprocess.PIPE, text=True
        )
        assert tx.stdout is not None
        assert tx.stdout.readline().strip() == "raised"
        start = link.stats()["a_to_b"]["delivered_bytes"]
        # a fifth of the file crossed the link: its MTU drops to 1,280 (1,252 bytes of UDP payload)
        eventually_sync(
            lambda: link.stats()["a_to_b"]["delivered_bytes"] - start >= size // 5, timeout=30, interval=0.002
        )
        # (the instant before the call: the forwarder applies the MTU before it answers, and a
        # loss may be suspected before this process reads that answer)
        lowered = time.monotonic()
        link.set_impairment(Impairment(delay=0.002, mtu=1280))
        line = tx.stdout.readline()
        assert tx.wait(30) == 0, line
        report = json.loads(line)
        rx.stdin.close()
        rx.wait(10)
        assert report["sha256"] == hashlib.sha256(data).hexdigest()
        assert (inbox / "f.bin").read_bytes() == data
        st = report["stats"]
        assert link.stats()["a_to_b"]["dropped_mtu"] > 0
        assert st["fallbacks"] == 1, report
        assert report["changes"][-1][1] == BASE_PLPMTU
        assert 0 < st["suspected_at"] - lowered < 2.0
        assert st["fell_back_at"] - st["suspected_at"] <= MAX_PROBES * st["longest_timeout"] + 0.05
