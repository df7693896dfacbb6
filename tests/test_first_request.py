"""The first request of a fresh process costs a dial, not imports.

A node imports the transport of a scheme when it listens on it or when an address of that scheme
enters its peer book (``add_peer``, or already there at ``start()``), so the first request does
not wait for aioquic or ssl to load (they took 35-75 ms). Timing a first request against a warm
dial on a shared machine is noise; what the first request imports is not: nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}

CLIENT = """
import asyncio, json, sys
import iac

async def main(peer: str, url: str, before_start: bool) -> None:
    alice = iac.Node()
    if before_start:
        alice.add_peer(peer, url)
    async with alice:
        if not before_start:
            alice.add_peer(peer, url)
        loaded = set(sys.modules)
        await alice.request(peer, "PING", timeout=10)
        first = sorted(set(sys.modules) - loaded)
        await alice.connection(peer).close()
        loaded = set(sys.modules)
        await alice.request(peer, "PING", timeout=10)
        print(json.dumps({"first": first, "warm": sorted(set(sys.modules) - loaded)}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "before"))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    key = tmp_path_factory.mktemp("keys") / "bob.key"
    subprocess.run(
        [sys.executable, "-m", "iac", "keygen", "--out", str(key)], check=True, env=ENV, timeout=30
    )
    urls = ["quic://127.0.0.1:0", "tls://127.0.0.1:0"]
    cmd = [sys.executable, "-m", "iac", "node", "--key", str(key), "--no-admin"]
    for u in urls:
        cmd += ["--listen", u]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[:1] == ["node"], first
        found = {"id": first[1]}
        for _ in urls:
            kind, url = proc.stdout.readline().split()
            assert kind == "listening"
            found[url.split(":", 1)[0]] = url
        yield found
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize(("scheme", "when"), [("tls", "after"), ("quic", "before")])
def test_the_first_request_imports_nothing(
    server: dict[str, str], scheme: str, when: str, tmp_path: Path
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, server["id"], server[scheme], when],
        capture_output=True, text=True, timeout=60, env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert loaded == {"first": [], "warm": []}, loaded


WARM = """
import asyncio, json, ssl, statistics, sys, time
import iac

built = []
new = ssl.SSLContext.__new__


def counted(cls, *args, **kwargs):
    built.append(cls.__name__)
    return new(cls, *args, **kwargs)


ssl.SSLContext.__new__ = staticmethod(counted)


async def request(node: iac.Node, peer: str) -> tuple[float, int]:
    before, cpu = len(built), time.process_time()
    await node.request(peer, "PING", timeout=10)
    cost = time.process_time() - cpu
    await node.connection(peer).close()
    return cost, len(built) - before


async def main(peer: str, url: str) -> None:
    alice = iac.Node()
    alice.add_peer(peer, url)
    async with alice:
        first = await request(alice, peer)
        warm = [await request(alice, peer) for _ in range(3)]
    print(json.dumps({
        "first_cpu": first[0], "warm_cpu": statistics.median(c for c, _ in warm),
        "first_contexts": first[1], "warm_contexts": [n for _, n in warm],
    }))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_the_first_tls_request_builds_no_context_and_costs_at_most_twice_a_warm_dial(
    server: dict[str, str], tmp_path: Path
) -> None:
    """The node builds its TLS client context at start(): no dial builds one, the first of the
    process included. The CPU time of the first request (process time, which a loaded machine
    stretches far less than the wall clock) is at most twice a warm dial's in the same process;
    today it is about 1.25 times, 1.4 before the context was built at start."""
    out = subprocess.run(
        [sys.executable, "-c", WARM, server["id"], server["tls"]],
        capture_output=True, text=True, timeout=60, env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["first_contexts"] == 0 and got["warm_contexts"] == [0, 0, 0], got
    assert got["first_cpu"] <= 2 * got["warm_cpu"], got


def test_dials_share_one_client_context_per_identity_configuration_and_key_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iac.errors import ConfigError
    from iac.transport.base import TransportConfig
    from iac.transport.tls import client_context, prepare_dial
    from iac.wire.identity import Identity

    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    alice, bob, config = Identity.generate(), Identity.generate(), TransportConfig()
    ctx = client_context(alice, config)
    assert client_context(alice, TransportConfig()) is ctx  # equal settings, one context
    assert client_context(bob, config) is not ctx
    monkeypatch.setenv("SSLKEYLOGFILE", str(tmp_path / "keys.log"))
    logged = client_context(alice, config)
    assert logged is not ctx and logged.keylog_filename == str(tmp_path / "keys.log")
    missing = TransportConfig(ca_file=str(tmp_path / "no-ca.pem"))
    prepare_dial(alice, missing)  # the dial reports it
    with pytest.raises(ConfigError, match="cannot load CA"):
        client_context(alice, missing)
