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
