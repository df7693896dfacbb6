"""``iac conformance`` as a user runs it: against a real ``iac node`` on every transport, listening
while ``iac ping``, ``iac request`` and ``iac send --ack`` dial it, and against targets that are
not there, not IAC, not the key named, or that stop in the middle of the run.

The broken doubles that make each case fail are in tests/test_conformance_doubles.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from iac.conformance import CASES, all_cases
from iac.conformance.listen import CLIENT_CASES, REFUSALS
from iac.conformance.vectors import live_accepts, live_negatives
from iac.wire.identity import Identity

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}
TRANSPORTS = ["tls", "unix", "quic"]


def iac(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def start_node(key: Path, listen: list[str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    cmd = [sys.executable, "-m", "iac", "node", "--key", str(key)]
    for u in listen:
        cmd += ["--listen", u]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[:1] == ["node"], (first, proc.stderr.read() if proc.stderr else "")
    addrs = {"id": first[1]}
    for _ in listen:
        kind, url = proc.stdout.readline().split()
        assert kind == "listening"
        addrs[url.split(":", 1)[0]] = url
    return proc, addrs


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("node")
    sock = Path(tempfile.mkdtemp(prefix="iac-cf-"))
    assert iac("keygen", "--out", str(d / "b.key")).returncode == 0
    proc, addrs = start_node(
        d / "b.key", ["tls://127.0.0.1:0", f"unix://{sock}/run/node.sock", "quic://127.0.0.1:0"]
    )
    try:
        yield addrs
    finally:
        stop(proc)


def report(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_passes_against_iac_node(node: dict[str, str], transport: str) -> None:
    out = iac("conformance", node[transport], "--to", node["id"], "--json", "--timeout", "5")
    doc = report(out)
    failed = [(c["id"], c["expected"], c["seen"]) for c in doc["cases"] if not c["passed"]]
    assert out.returncode == 0 and not failed, failed
    ids = [c["id"] for c in doc["cases"]]
    assert len(ids) == len(set(ids))
    assert sum(i.startswith("accept.") for i in ids) == 7
    assert sum(i.startswith("vector.") for i in ids) == 62  # the 64 negatives but the two that need 256 bytes
    expected = {c.id for c in CASES if transport in c.transports}
    expected |= {f"vector.{v.name}" for v in live_negatives()} | {f"accept.{v.name}" for v in live_accepts()}
    expected |= {"quic.dict_unidirectional"} if transport == "quic" else set()
    assert set(ids) == expected
    for c in doc["cases"]:
        assert c["section"] and c["quote"] and c["expected"] and c["seen"]


def test_text_output_and_case_filter(node: dict[str, str]) -> None:
    out = iac(
        "conformance", node["unix"], "--to", node["id"], "--case", "hello.refuse", "--case", "ping.reply"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert all(
        line.startswith("PASS hello.refuse.") or line.startswith("PASS ping.reply") for line in lines[:-1]
    )
    assert lines[-1].startswith(f"{len(lines) - 1} passed, 0 failed of {len(lines) - 1} cases")
    assert iac("conformance", node["unix"], "--to", node["id"], "--case", "nothing").returncode == 2
    assert iac("conformance", node["unix"]).returncode == 2  # --to missing: a usage error


def test_wrong_to_fails_the_identity_case(node: dict[str, str]) -> None:
    other = Identity.generate().agent_id
    out = iac("conformance", node["tls"], "--to", other, "--json", "--case", "hello", "--case", "ping.reply")
    doc = report(out)
    assert out.returncode == 1
    failed = {c["id"]: c for c in doc["cases"] if not c["passed"]}
    # the tester's HELLO names --to: the node refuses it (wrong_peer) instead of answering
    assert "hello.identity" in failed and "0x12 wrong_peer" in failed["hello.identity"]["seen"]
    assert node["id"][:16] in failed["hello.identity"]["seen"]


@pytest.mark.parametrize(
    "url", ["tls://127.0.0.1:{tcp}", "quic://127.0.0.1:{udp}", "unix:///nonexistent/iac.sock"]
)
def test_unreachable_is_exit_2_and_every_case_ends_in_its_timeout(url: str) -> None:
    url = url.format(tcp=free_port(socket.SOCK_STREAM), udp=free_port(socket.SOCK_DGRAM))
    t0 = time.monotonic()
    out = iac(
        "conformance",
        url,
        "--to",
        Identity.generate().agent_id,
        "--json",
        "--timeout",
        "0.5",
        "--case",
        "hello.signature",
        "--case",
        "hello.refuse.stale",
        "--case",
        "ping.reply",
    )
    took = time.monotonic() - t0
    doc = report(out)
    assert out.returncode == 2 and not doc["reached"]
    n = len(doc["cases"])
    assert n == 3 and doc["failed"] == n
    assert all(c["seconds"] < 1.5 for c in doc["cases"]), [c["seconds"] for c in doc["cases"]]
    if url.startswith("quic"):  # no ICMP answer reaches a QUIC client: each case waits out its timeout
        assert all("no answer in 0.5 s" in c["seen"] for c in doc["cases"])
    assert took < n * 1.5 + 5


def test_non_iac_server_is_exit_2() -> None:
    """A TCP server that answers every connection with an HTTP error and hangs up (no TLS)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stopping = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stopping.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        out = iac(
            "conformance",
            f"tls://127.0.0.1:{port}",
            "--to",
            Identity.generate().agent_id,
            "--json",
            "--timeout",
            "1",
            "--case",
            "hello",
        )
    finally:
        stopping.set()
        t.join()
        srv.close()
    doc = report(out)
    assert out.returncode == 2 and doc["failed"] == len(doc["cases"]) > 0
    assert all(c["seconds"] < 2 for c in doc["cases"])


def test_node_stopping_mid_run(tmp_path: Path) -> None:
    assert iac("keygen", "--out", str(tmp_path / "n.key")).returncode == 0
    proc, addrs = start_node(tmp_path / "n.key", ["tls://127.0.0.1:0"])
    tester = subprocess.Popen(
        [sys.executable, "-m", "iac", "conformance", addrs["tls"], "--to", addrs["id"], "--timeout", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert tester.stdout is not None
        lines = [tester.stdout.readline() for _ in range(8)]
        assert all(line.startswith("PASS ") for line in lines), lines
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        rest = tester.stdout.read().splitlines()
        assert tester.wait(timeout=60) == 1
    finally:
        stop(proc)
        if tester.poll() is None:
            tester.kill()
            tester.wait()
        for stream in (tester.stdout, tester.stderr):
            if stream is not None:
                stream.close()
    summary = rest[-1]
    assert "failed of" in summary and ", 0 failed" not in summary
    fails = [line for line in rest if line.startswith("FAIL ")]
    assert len(fails) > 50  # every case after the stop ran, and failed on its own
    assert sum(line.startswith("PASS ") for line in rest) < 5


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_listening_while_the_cli_dials(tmp_path: Path, transport: str) -> None:
    sock = Path(tempfile.mkdtemp(prefix="iac-cf-"))
    url = {"tls": "tls://127.0.0.1:0", "quic": "quic://127.0.0.1:0", "unix": f"unix://{sock}/t.sock"}[
        transport
    ]
    assert iac("keygen", "--out", str(tmp_path / "a.key")).returncode == 0
    tester = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "iac",
            "conformance",
            "--client",
            url,
            "--connections",
            "3",
            "--wait",
            "20",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert tester.stdout is not None
        tid = tester.stdout.readline().split()[1]
        addr = tester.stdout.readline().split()[1]
        key = str(tmp_path / "a.key")
        base = [sys.executable, "-m", "iac"]
        target = ["--key", key, "--to", tid, "--addr", addr]
        dialers = [  # the three at once: each is a connection of its own
            subprocess.Popen(
                [*base, "ping", *target, "--count", "2"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            ),
            subprocess.Popen(
                [*base, "request", *target, "--type", "RUN", "--payload", '{"x": 1}'],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            ),
            subprocess.Popen(
                [*base, "send", *target, "--type", "RUN", "--payload", "{}", "--ack"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            ),
        ]
        (ping, _), (req, _), (send, _) = outs = [d.communicate(timeout=30) for d in dialers]
        assert [d.returncode for d in dialers] == [0, 0, 0], outs
        assert ping.startswith(f"{transport} ") and "count=2" in ping
        assert json.loads(req) == {"x": 1}
        assert send.strip().endswith("acked")
        doc = json.loads(tester.stdout.read())
        assert tester.wait(timeout=30) == 0
    finally:
        if tester.poll() is None:
            tester.kill()
            tester.wait()
        for stream in (tester.stdout, tester.stderr):
            if stream is not None:
                stream.close()
    assert doc["exit_status"] == 0 and doc["failed"] == 0, [c for c in doc["cases"] if not c["passed"]]
    seen = {c["id"] for c in doc["cases"]}
    assert seen == set(CLIENT_CASES), set(CLIENT_CASES) - seen
    assert len(doc["cases"]) == 3 * len(CLIENT_CASES)


def test_client_mode_with_nobody_dialing_is_exit_2() -> None:
    out = iac("conformance", "--client", "tls://127.0.0.1:0", "--wait", "0.3", "--json")
    assert out.returncode == 2
    lines = out.stdout.splitlines()
    doc = json.loads("\n".join(lines[2:]))
    assert [c["seen"] for c in doc["cases"]] == ["no connection in 0.3 s"]


def test_every_case_id_is_unique_and_cites_a_section() -> None:
    cases = all_cases()
    ids = [c.id for c in cases] + list(CLIENT_CASES)
    assert len(ids) == len(set(ids))
    for c in cases:
        assert c.section.split()[0].isdigit() and len(c.quote) > 20


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_listening_with_refusals_while_iac_ping_dials(tmp_path: Path, transport: str) -> None:
    """--refusals: five forged server HELLOs, each refused by `iac ping` with its close code."""
    sock = Path(tempfile.mkdtemp(prefix="iac-cf-"))
    url = {"tls": "tls://127.0.0.1:0", "quic": "quic://127.0.0.1:0", "unix": f"unix://{sock}/t.sock"}[
        transport
    ]
    assert iac("keygen", "--out", str(tmp_path / "a.key")).returncode == 0
    n = len(REFUSALS)
    tester = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "iac",
            "conformance",
            "--client",
            url,
            "--refusals",
            "--connections",
            str(n),
            "--wait",
            "20",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert tester.stdout is not None
        tid = tester.stdout.readline().split()[1]
        addr = tester.stdout.readline().split()[1]
        argv = [
            sys.executable,
            "-m",
            "iac",
            "ping",
            "--key",
            str(tmp_path / "a.key"),
            "--to",
            tid,
            "--addr",
            addr,
            "--count",
            "1",
        ]
        pings = [
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
            for _ in range(n)
        ]
        errors = [p.communicate(timeout=30)[1] for p in pings]
        assert [p.returncode for p in pings] == [1] * n, errors
        doc = json.loads(tester.stdout.read())
        assert tester.wait(timeout=30) == 0
    finally:
        if tester.poll() is None:
            tester.kill()
            tester.wait()
        for stream in (tester.stdout, tester.stderr):
            if stream is not None:
                stream.close()
    assert doc["failed"] == 0 and [c["id"] for c in doc["cases"]] == [r.id for r in REFUSALS], doc["cases"]
    names = {"hello_bad_signature", "stale_hello", "channel_binding_mismatch", "wrong_peer"}
    assert all(any(name in e for e in errors) for name in names), errors
