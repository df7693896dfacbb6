"""Debugging QUIC and TLS: SSLKEYLOGFILE on both (a key log Wireshark reads) and qlog per QUIC
connection (qvis), from the library and from `iac ping --qlog`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run

import iac
from iac.transport import debug
from iac.transport.base import TransportConfig

#: One line of the NSS key log format: LABEL <client random, 32 bytes> <secret>.
KEYLOG_LINE = re.compile(r"([A-Z_0-9]+) ([0-9a-f]{64}) ([0-9a-f]{64,128})")
TLS13_LABELS = {
    "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
    "SERVER_HANDSHAKE_TRAFFIC_SECRET",
    "CLIENT_TRAFFIC_SECRET_0",
    "SERVER_TRAFFIC_SECRET_0",
}


def keylog(path: Path) -> list[tuple[str, str, str]]:
    """The entries of a key log file (comment lines skipped); every other line must parse."""
    out = []
    for line in path.read_text(encoding="ascii").splitlines():
        if not line or line.startswith("#"):
            continue
        m = KEYLOG_LINE.fullmatch(line)
        assert m is not None, line
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


async def exchange(transport: str, config: TransportConfig | None = None) -> None:
    cfg = iac.NodeConfig(transport=config) if config is not None else None
    async with (
        iac.Node(listen=[f"{transport}://127.0.0.1:0"], config=cfg) as bob,
        iac.Node(config=cfg) as alice,
    ):
        bob.on(iac.MessageType.RUN)(lambda ctx: ctx.payload)
        alice.add_peer(bob.agent_id, *bob.addresses)
        for i in range(2):
            assert (await alice.request(bob.agent_id, iac.MessageType.RUN, i, timeout=5)).payload == i


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_sslkeylogfile_writes_tls13_secrets(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / f"{transport}.keys"
    monkeypatch.setenv("SSLKEYLOGFILE", str(path))
    with caplog.at_level(logging.WARNING, logger="iac.transport"):
        run(exchange(transport))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # secrets: readable by this user only
    entries = keylog(path)
    labels = {label for label, _, _ in entries}
    assert labels >= TLS13_LABELS, labels
    # one handshake: each label once per side and connection, all under one client random
    randoms = {r for label, r, _ in entries if label == "CLIENT_HANDSHAKE_TRAFFIC_SECRET"}
    assert len(randoms) >= 1
    for label in TLS13_LABELS:
        assert {r for lab, r, _ in entries if lab == label} == randoms, label
    warnings = [r for r in caplog.records if "SSLKEYLOGFILE" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert str(path) in warnings[0].getMessage() and "decrypt" in warnings[0].getMessage()


def test_no_key_log_without_sslkeylogfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    assert debug.keylog_path() is None


def _events(trace: dict[str, Any]) -> set[str]:
    return {e["name"] for e in trace["events"]}


def test_qlog_dir_writes_a_qlog_per_quic_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    qlogs = tmp_path / "qlog"
    run(exchange("quic", TransportConfig(qlog_dir=str(qlogs))))
    debug.qlog_writer(str(qlogs), "aioquic").flush()  # connections not yet drained: written now
    files = sorted(qlogs.glob("*.qlog"))
    by_side = {f.stem.rsplit("_", 1)[1]: f for f in files}
    assert set(by_side) == {"client", "server"}, files
    assert by_side["client"].stem.split("_")[0] == by_side["server"].stem.split("_")[0]  # one connection
    for side, f in by_side.items():
        doc = json.loads(f.read_text())
        assert doc["qlog_format"] == "JSON" and doc["qlog_version"]
        (trace,) = doc["traces"]
        assert trace["vantage_point"]["type"] == side
        names = _events(trace)
        assert {"transport:packet_sent", "transport:packet_received"} <= names, names
        assert all(isinstance(e["time"], int | float) for e in trace["events"])


def test_iac_ping_with_qlog_and_a_key_log(tmp_path: Path) -> None:
    """`iac ping --qlog DIR` over QUIC with SSLKEYLOGFILE set: a client qlog in DIR, the secrets
    in the key log, one WARNING line about it on stderr, and the ping itself succeeds."""
    keys, qlogs = tmp_path / "ping.keys", tmp_path / "qlog"
    key = tmp_path / "a.key"
    iac.Identity.generate().save(key)
    env = {**os.environ, "SSLKEYLOGFILE": str(keys)}

    async def main() -> tuple[int, str, str]:
        async with iac.Node(listen=["quic://127.0.0.1:0"]) as bob:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "iac", "ping", "--key", str(key), "--to", bob.agent_id,
                "--addr", bob.addresses[0], "--count", "3", "--qlog", str(qlogs),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode is not None
            return proc.returncode, out.decode(), err.decode()

    code, out, err = run(main(), timeout=90)
    assert code == 0, err
    assert out.startswith("quic ") and "count=3" in out
    assert err.count("\n") == 1 and "SSLKEYLOGFILE is set" in err
    assert {label for label, _, _ in keylog(keys)} >= TLS13_LABELS
    (qlog,) = qlogs.glob("*_client.qlog")
    (trace,) = json.loads(qlog.read_text())["traces"]
    assert trace["vantage_point"]["type"] == "client"
    assert "transport:packet_sent" in _events(trace)


def test_qlog_option_refuses_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    key = tmp_path / "a.key"
    iac.Identity.generate().save(key)
    out = run_cli("ping", "--key", str(key), "--to", iac.Identity.generate().agent_id,
                  "--addr", "quic://127.0.0.1:9", "--qlog", str(f))  # fmt: skip
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "--qlog" in out.stderr and "give a directory" in out.stderr


def test_iac_ping_with_bbr(tmp_path: Path) -> None:
    """`iac ping --congestion bbr` over QUIC: the ping succeeds and the client's qlog shows BBR
    (its state in every metrics update); an unknown algorithm is a usage error, no traceback."""
    key, qlogs = tmp_path / "a.key", tmp_path / "qlog"
    iac.Identity.generate().save(key)

    async def main() -> subprocess.CompletedProcess[str]:
        async with iac.Node(listen=["quic://127.0.0.1:0"]) as bob:
            return await asyncio.to_thread(
                run_cli, "ping", "--key", str(key), "--to", bob.agent_id, "--addr", bob.addresses[0],
                "--count", "3", "--congestion", "bbr", "--qlog", str(qlogs),
            )  # fmt: skip

    out = run(main(), timeout=90)
    assert out.returncode == 0, out.stderr
    (qlog,) = qlogs.iterdir()
    assert '"bbr_state"' in qlog.read_text()
    bad = run_cli("ping", "--key", str(key), "--to", iac.Identity.generate().agent_id,
                  "--addr", "quic://127.0.0.1:9", "--congestion", "vegas")  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'vegas'" in bad.stderr and "Traceback" not in bad.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSLKEYLOGFILE"}
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, env=env, timeout=60
    )
