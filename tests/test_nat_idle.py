"""Two `iac node --nat` processes behind two MASQUERADE NATs (network namespaces, iac.testing.nat)
and an `iac registry --relay`, all with their CLI defaults: after idling longer than the NATs keep
a UDP mapping, each is still reached through the relay (its kept connection to the registry, probed
every 2 s, keeps its NAT's mapping open).

By default the NATs' conntrack UDP timeouts are lowered to 3 s and the nodes idle 7 s; with
IAC_SLOW=1 they idle the real 60 s behind NATs that keep a mapping 30 s (Linux conntrack's UDP
default for a flow seen one way; its 120 s for a flow seen both ways is lowered to 30 s too)."""

from __future__ import annotations

import asyncio
import json
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


@needs_lab
def test_iac_node_punch_upgrades_to_a_direct_path_through_two_nats(tmp_path: Path) -> None:
    """`iac node --nat --registry ... --punch B`: A reaches B through the relaying registry and
    punches a direct path through both NATs (iac status shows it direct; packets cross between the
    NATs); B was started with `--nat` only and answers the punch."""
    keys = {}
    for name in ("reg", "a", "b"):
        keys[name] = tmp_path / f"{name}.key"
        Identity.generate().save(keys[name])
    b_id = Identity.load(keys["b"]).agent_id
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    admin = run_dir / "a.sock"
    with NatLab(tag=f"p{os.getpid() % 100000}") as lab:

        async def status() -> dict[str, object]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "iac", "status", "--admin", str(admin), "--json",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err.decode()
            doc: dict[str, object] = json.loads(out)
            return doc

        async def main() -> None:
            url = f"quic://{PUBLIC_ADDR}:{REG_PORT}"
            procs: list[asyncio.subprocess.Process] = []
            try:
                reg, out = await start(
                    lab.public, "registry", "--key", str(keys["reg"]), "--listen", url, "--store", "memory",
                    "--relay", "--no-admin", lines=3,
                )  # fmt: skip
                procs.append(reg)
                rid = out[0][1]
                node_b, _ = await start(
                    lab.host_b, "node", "--key", str(keys["b"]), "--listen", f"quic://{lab.addr_b}:0",
                    "--registry", f"{rid}@{url}", "--nat", "--no-admin", lines=3,
                )  # fmt: skip
                procs.append(node_b)
                forwarded = lab.forwarded()
                node_a, _ = await start(
                    lab.host_a, "node", "--key", str(keys["a"]), "--listen", f"quic://{lab.addr_a}:0",
                    "--registry", f"{rid}@{url}", "--nat", "--punch", b_id, "--admin", str(admin), lines=3,
                )  # fmt: skip
                procs.append(node_a)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while True:
                    stats = (await status())["stats"]
                    assert isinstance(stats, dict)
                    nat = stats["nat"]
                    if nat["paths"].get(b_id) == "direct":
                        break
                    assert loop.time() < deadline, nat
                    await asyncio.sleep(0.5)  # polling another process's status, bounded above
                assert nat["punch_successes"] >= 1
                link = stats["peer_links"][b_id]
                assert link["path"] == "direct", link
                assert lab.forwarded() > forwarded  # packets went from NAT to NAT, not via the relay
            finally:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
                    await p.wait()

        run(main(), timeout=90)


LOOKUP = """
import asyncio, json, sys
from iac import MeshClient, Node
async def main() -> None:
    rid, url, aid = sys.argv[1:4]
    async with Node() as n, MeshClient(n, rid, [url], publish=False) as m:
        found = await m.lookup(agent_id=aid)
        print(json.dumps([list(c) for c in found[0].candidates] if found else None))
asyncio.run(main())
"""


@needs_lab
def test_a_record_drops_the_observed_address_a_nat_no_longer_maps(tmp_path: Path) -> None:
    """A symmetric NAT forgets its mappings while the registry restarts (`--store memory`): the
    node's kept connection comes back from a new NAT port, and the record it publishes again lists
    the address the registry sees now, not the one that no longer reaches it."""
    keys = {}
    for name in ("reg", "a"):
        keys[name] = tmp_path / f"{name}.key"
        Identity.generate().save(keys[name])
    a_id = Identity.load(keys["a"]).agent_id
    with NatLab(tag=f"r{os.getpid() % 100000}", symmetric=True) as lab:

        async def main() -> None:
            url = f"quic://{PUBLIC_ADDR}:{REG_PORT}"
            env = {**os.environ, "PYTHONPATH": str(ROOT)}

            async def observed() -> list[str]:
                proc = await asyncio.create_subprocess_exec(
                    "ip", "netns", "exec", lab.public, sys.executable, "-c", LOOKUP, rid, url, a_id,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                )  # fmt: skip
                out, err = await asyncio.wait_for(proc.communicate(), 30)
                assert proc.returncode == 0, err.decode()
                cands = json.loads(out) or []
                return [v for k, v in cands if k == "observed"]

            async def registry() -> asyncio.subprocess.Process:
                reg, _ = await start(
                    lab.public, "registry", "--key", str(keys["reg"]), "--listen", url, "--store", "memory",
                    "--relay", "--no-admin", lines=3,
                )  # fmt: skip
                return reg

            procs: list[asyncio.subprocess.Process] = []
            try:
                reg = await registry()
                procs.append(reg)
                rid = Identity.load(keys["reg"]).agent_id
                node, _ = await start(
                    lab.host_a, "node", "--key", str(keys["a"]), "--listen", f"quic://{lab.addr_a}:0",
                    "--registry", f"{rid}@{url}", "--nat", "--no-admin", lines=3,
                )  # fmt: skip
                procs.append(node)
                first = await observed()
                assert len(first) == 1 and first[0].startswith(f"quic://{lab.wan_a}:"), first
                reg.kill()
                await reg.wait()
                lab.flush_mappings(lab.nat_a)  # the NAT forgets: the next packet gets a new port
                reg = await registry()
                procs.append(reg)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while (now := await observed()) in ([], first):
                    assert loop.time() < deadline, now
                assert len(now) == 1 and now[0].startswith(f"quic://{lab.wan_a}:") and now != first, now
            finally:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
                    await p.wait()

        run(main(), timeout=90)


def test_punch_without_nat_and_a_registry_is_one_line(tmp_path: Path) -> None:
    key = tmp_path / "a.key"
    Identity.generate().save(key)
    peer = Identity.generate().agent_id
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [
        sys.executable,
        "-m",
        "iac",
        "node",
        "--key",
        str(key),
        "--listen",
        "quic://127.0.0.1:0",
        "--no-admin",
    ]

    async def main() -> list[tuple[int, str]]:
        out = []
        for extra in (
            ["--punch", peer],
            ["--nat", "--registry", f"{peer}@quic://127.0.0.1:9", "--punch", "x"],
        ):
            proc = await asyncio.create_subprocess_exec(
                *base, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
            )
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            out.append((int(proc.returncode or 0), err.decode()))
        return out

    (code1, err1), (code2, err2) = run(main())
    assert code1 != 0 and err1.count("\n") == 1 and "add --nat and --registry" in err1, err1
    assert code2 != 0 and err2.count("\n") == 1 and "--punch 'x': not an AgentId" in err2, err2
