"""Two `iac node --nat` processes behind two MASQUERADE NATs (network namespaces, iac.testing.nat)
and an `iac registry --relay`, all with their CLI defaults: after idling longer than the NATs keep
a UDP mapping, each is still reached through the relay (its kept connection to the registry, probed
every 2 s, keeps its NAT's mapping open).

By default the NATs' conntrack UDP timeouts are lowered to 3 s and the nodes idle 7 s; with
IAC_SLOW=1 they idle the real 60 s behind NATs that keep a mapping 30 s (Linux conntrack's UDP
default for a flow seen one way; its 120 s for a flow seen both ways is lowered to 30 s too)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run

from iac.testing.nat import PUBLIC_ADDR, NatLab, unavailable
from iac.testing.nat import run as lab_run
from iac.wire.identity import Identity

needs_lab = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
REG_PORT = 7451
SLOW = os.environ.get("IAC_SLOW") == "1"


async def start(ns: str, *argv: str, lines: int) -> tuple[asyncio.subprocess.Process, list[list[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns, sys.executable, "-m", "iac", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    got = []
    for _ in range(lines):
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, f"{argv[0]} ended: {(await proc.stderr.read()).decode() if proc.stderr else ''}"
        got.append(line.decode().split())
    return proc, got


async def request(ns: str, key: Path, to: str, via: str, url: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns, sys.executable, "-m", "iac", "request", "--key", str(key),
        "--to", to, "--via", via, "--addr", url, "--type", "PING", "--timeout", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def scenario(tmp_path: Path, conntrack_s: int, idle_s: float) -> None:
    keys = {}
    for name in ("reg", "a", "b", "ca", "cb"):
        keys[name] = tmp_path / f"{name}.key"
        Identity.generate().save(keys[name])
    a_id, b_id = (Identity.load(keys[n]).agent_id for n in ("a", "b"))
    with NatLab(tag=f"i{os.getpid() % 100000}") as lab:
        for nat in (lab.nat_a, lab.nat_b):
            for name in ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"):
                lab_run("sysctl", "-qw", f"net.netfilter.{name}={conntrack_s}", ns=nat)

        async def main() -> None:
            url = f"quic://{PUBLIC_ADDR}:{REG_PORT}"
            procs: list[asyncio.subprocess.Process] = []
            t_start = time.monotonic()
            try:
                reg, out = await start(
                    lab.public, "registry", "--key", str(keys["reg"]), "--listen", url, "--store", "memory",
                    "--relay", "--no-admin", lines=3,
                )  # fmt: skip
                procs.append(reg)
                rid = out[0][1]
                hosts = ((lab.host_a, keys["a"], lab.addr_a), (lab.host_b, keys["b"], lab.addr_b))
                started = await asyncio.gather(*(
                    start(ns, "node", "--key", str(key), "--listen", f"quic://{addr}:0", "--registry",
                          f"{rid}@{url}", "--nat", "--no-admin", lines=3)
                    for ns, key, addr in hosts
                ))  # fmt: skip
                for node, out in started:
                    procs.append(node)
                    assert out[2][:2] == ["candidate", "observed"], out  # seen behind its NAT
                t0 = time.monotonic()
                await asyncio.sleep(idle_s)  # the scenario: nobody sends anything for this long
                mapped = lab_run("conntrack", "-L", "-p", "udp", ns=lab.nat_a, check=False)
                assert str(REG_PORT) in mapped, mapped  # the kept connection's mapping is still there
                t1 = time.monotonic()
                # from behind each NAT, through the relay, to the node behind the other
                replies = await asyncio.gather(
                    request(lab.host_b, keys["cb"], a_id, rid, url),
                    request(lab.host_a, keys["ca"], b_id, rid, url),
                )
                took = time.monotonic() - t1
                print(f"setup {t0 - t_start:.1f} s, idle {t1 - t0:.1f} s, requests {took:.1f} s")
                assert replies[0].startswith(f"PING answered by {a_id}"), replies
                assert replies[1].startswith(f"PING answered by {b_id}"), replies
            finally:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
                    await p.wait()

        run(main(), timeout=idle_s + 120)


@needs_lab
@pytest.mark.slow  # NATs that keep a mapping 3 s, 7 s idle; IAC_SLOW=1: 30 s and the real 60 s
def test_two_cli_nodes_behind_two_nats_reach_each_other_after_idling_past_the_nat_timeout(
    tmp_path: Path,
) -> None:
    if SLOW:
        scenario(tmp_path, conntrack_s=30, idle_s=60.0)
    else:
        scenario(tmp_path, conntrack_s=3, idle_s=7.0)
