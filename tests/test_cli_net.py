"""`iac node`, `iac ping` and `iac certs init` as a user runs them (real processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TRANSPORT_PARAMS, EchoNode, roundtrip, run

from iac.cli.net import percentile
from iac.errors import TransportError
from iac.transport import dial, listen
from iac.transport.base import TransportConfig
from iac.transport.certs import init_ca
from iac.wire.identity import Identity

#: Nodes serve their status socket in a directory of their own, not in the user's runtime dir.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}


def iac(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path, str]:
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    assert iac("keygen", "--out", str(a)).returncode == 0
    out = iac("keygen", "--out", str(b))
    assert out.returncode == 0
    return a, b, out.stdout.strip()


@pytest.fixture
def node(keys: tuple[Path, Path, str], sockdir: Path) -> Iterator[dict[str, str]]:
    _, bkey, _ = keys
    listen_urls = ["tls://127.0.0.1:0", f"unix://{sockdir}/run/node.sock"]
    if "quic" in TRANSPORT_PARAMS:
        listen_urls.insert(0, "quic://127.0.0.1:0")
    cmd = [sys.executable, "-m", "iac", "node", "--key", str(bkey)]
    for u in listen_urls:
        cmd += ["--listen", u]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[:1] == ["node"], first
        addrs: dict[str, str] = {"id": first[1]}
        for _ in listen_urls:
            kind, url = proc.stdout.readline().split()
            assert kind == "listening"
            addrs[url.split(":", 1)[0]] = url
        yield addrs
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_node_and_ping(keys: tuple[Path, Path, str], node: dict[str, str]) -> None:
    akey, _, bid = keys
    assert node["id"] == bid
    for transport in ("tls", "unix", *(["quic"] if "quic" in node else [])):
        out = iac("ping", "--key", str(akey), "--to", bid, "--addr", node[transport], "--count", "5")
        assert out.returncode == 0, out.stderr
        line = out.stdout.strip()
        assert line.startswith(f"{transport} ") and "count=5" in line
        assert "min=" in line and "median=" in line and "p99=" in line


def _one_quick_error(out: subprocess.CompletedProcess[str], seconds: float, *texts: str) -> None:
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for text in texts:
        assert text in lines[0], lines[0]
    assert seconds < 15, f"took {seconds:.1f} s: waited for a timeout instead of the refusal"


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    out = iac(*args, timeout=60)
    return out, time.monotonic() - t0


def test_a_plain_node_refuses_at_once_what_it_has_no_handler_for(
    keys: tuple[Path, Path, str], node: dict[str, str], tmp_path: Path
) -> None:
    """A plain `iac node` is a node like any other: a request, a call or a file it has no
    handler for is refused with ``no_handler`` at once, not left to time out."""
    akey, _, bid = keys
    to = ["--key", str(akey), "--to", bid, "--addr", node["tls"], "--timeout", "30"]
    out, took = timed("request", *to, "--type", "RUN", "--payload", '{"x": 1}')
    _one_quick_error(out, took, "iac request: error:", "no_handler")
    out, took = timed("call", *to, "add", "1", "2")
    _one_quick_error(out, took, "iac call: error:", "no_handler", "'add'")
    f = tmp_path / "f.txt"
    f.write_text("hello")
    out, took = timed("send-file", *to, str(f), "--quiet")
    _one_quick_error(out, took, "iac send-file: error:", "no_handler", "no inbox")
    out, took = timed("send", *to, "--type", "RUN", "--ack")
    _one_quick_error(out, took, "iac send: error:", "no_handler")


def test_a_registry_that_is_not_one_fails_at_once(keys: tuple[Path, Path, str], node: dict[str, str]) -> None:
    akey, _, bid = keys
    registry = f"{bid}@{node['tls']}"
    out, took = timed("node", "--key", str(akey), "--listen", "tls://127.0.0.1:0", "--registry", registry)
    _one_quick_error(out, took, "iac node: error: --registry", "not a registry", "no_handler")
    assert out.stdout == ""


def test_node_options_that_need_another_are_refused(keys: tuple[Path, Path, str]) -> None:
    akey, _, _ = keys
    base = ["node", "--key", str(akey), "--listen", "tls://127.0.0.1:0"]
    out, took = timed(*base, "--alias", "me.test")
    _one_quick_error(out, took, "--alias", "--registry")
    out, took = timed(*base, "--max-file-size", "10")
    _one_quick_error(out, took, "--max-file-size", "--inbox")


def test_ping_falls_back_and_honours_policy(keys: tuple[Path, Path, str], node: dict[str, str]) -> None:
    akey, _, bid = keys
    addrs = ["--addr", "quic://127.0.0.1:9", "--addr", node["tls"]]
    out = iac("ping", "--key", str(akey), "--to", bid, *addrs, "--count", "2", "--forbid", "quic")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tls ")


def test_wrong_to_is_one_line_and_nonzero(keys: tuple[Path, Path, str], node: dict[str, str]) -> None:
    akey, _, _ = keys
    other = Identity.generate().agent_id
    out = iac("ping", "--key", str(akey), "--to", other, "--addr", node["tls"], "--count", "1")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "wrong_peer" in lines[0], out.stderr
    assert out.stdout == ""


def test_no_route_is_one_line(keys: tuple[Path, Path, str], tmp_path: Path) -> None:
    akey, _, bid = keys
    out = iac(
        "ping", "--key", str(akey), "--to", bid, "--addr", f"unix://{tmp_path}/none.sock", "--timeout", "1"
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach" in lines[0], out.stderr


def test_bad_to_is_one_line(keys: tuple[Path, Path, str]) -> None:
    akey, _, _ = keys
    out = iac("ping", "--key", str(akey), "--to", "planner", "--addr", "tls://127.0.0.1:9")
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1


def test_request_ping_prints_who_answered_and_the_round_trip(
    keys: tuple[Path, Path, str], node: dict[str, str]
) -> None:
    akey, _, bid = keys
    out = iac("request", "--key", str(akey), "--to", bid, "--addr", node["tls"], "--type", "PING")
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(
        rf"PING answered by {bid} in \d+\.\d{{3}} ms \(with connection set-up\)\n", out.stdout
    )


def test_delegate_task_carries_the_task_envelope(keys: tuple[Path, Path, str], node: dict[str, str]) -> None:
    """With --task the envelope passes the node's checks (a plain node then has no handler); a
    bad one is refused by the node as bad_task."""
    akey, _, bid = keys
    to = ["--key", str(akey), "--to", bid, "--addr", node["tls"], "--type", "DELEGATE_TASK"]
    task = '{"task_id": "t1", "intent": "ASSIGN_TASK", "step": 1, "steps": 2, "state_ref": "s3://x"}'
    out, took = timed("request", *to, "--task", task)
    _one_quick_error(out, took, "iac request: error:", "no_handler")
    out, took = timed("send", *to, "--task", task, "--ack")
    _one_quick_error(out, took, "iac send: error:", "no_handler")


def test_ping_stopped_with_ctrl_c_prints_what_it_measured(
    keys: tuple[Path, Path, str], node: dict[str, str]
) -> None:
    akey, _, bid = keys
    cmd = [sys.executable, "-m", "iac", "ping", "--key", str(akey), "--to", bid, "--addr", node["tls"]]
    proc = subprocess.Popen(
        [*cmd, "--count", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )
    time.sleep(4)  # started and pinging
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    match = re.match(r"tls \S+ \w{16}… count=(\d+) of 1000000 \(interrupted\) rtt_ms min=", out)
    assert match is not None and int(match.group(1)) > 0, out
    assert err == ""


def test_send_ack_gives_up_after_its_timeout(keys: tuple[Path, Path, str]) -> None:
    """A node that stopped answering (SIGSTOP: the kernel still accepts the TCP connection):
    `send --ack --timeout 2` gives up after about 2 s, dial included (it used to wait 5 s more)."""
    akey, bkey, bid = keys
    proc = subprocess.Popen(
        [sys.executable, "-m", "iac", "node", "--key", str(bkey), "--listen", "tls://127.0.0.1:0",
         "--no-admin"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        addr = proc.stdout.readline().split()[1]
        t0 = time.monotonic()
        startup = iac(
            "send", "--key", str(akey), "--to", bid, "--addr", "tls://127.0.0.1:9", "--timeout", "2"
        )
        baseline = time.monotonic() - t0  # a process that fails at once: start-up and exit
        assert startup.returncode == 1
        proc.send_signal(signal.SIGSTOP)
        out, took = timed("send", "--key", str(akey), "--to", bid, "--addr", addr, "--ack", "--timeout", "2")
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
        assert "within 2 s" in out.stderr and "larger --timeout" in out.stderr, out.stderr
        assert took < baseline + 2 + 2.5, (took, baseline)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.communicate(timeout=30)


def test_percentile() -> None:
    assert percentile([1.0], 99) == 1.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 99) == 99.0 and percentile(values, 50) == 50.0


def test_certs_init_and_ca_mode(tmp_path: Path, sockdir: Path) -> None:
    d = tmp_path / "certs"
    out = iac("certs", "init", "--dir", str(d), "--node", "alpha", "--node", "beta")
    assert out.returncode == 0, out.stderr
    for name in ("ca.pem", "ca.key", "alpha.pem", "alpha.key", "beta.pem", "beta.key"):
        assert (d / name).exists()
    assert (d / "ca.key").stat().st_mode & 0o077 == 0
    assert (d / "alpha.key").stat().st_mode & 0o077 == 0
    again = iac("certs", "init", "--dir", str(d), "--node", "alpha")
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1

    server, client = Identity.generate(), Identity.generate()
    base = {"handshake_timeout": 3.0, "linger_timeout": 0.3}
    sconf = TransportConfig(
        ca_file=str(d / "ca.pem"), cert_file=str(d / "alpha.pem"), key_file=str(d / "alpha.key"), **base
    )
    cconf = TransportConfig(
        ca_file=str(d / "ca.pem"), cert_file=str(d / "beta.pem"), key_file=str(d / "beta.key"), **base
    )
    other = tmp_path / "other"
    init_ca(other, ["gamma"])
    stranger = TransportConfig(
        ca_file=str(d / "ca.pem"),
        cert_file=str(other / "gamma.pem"),
        key_file=str(other / "gamma.key"),
        **base,
    )

    async def main() -> None:
        lst = await listen("tls://127.0.0.1:0", server, EchoNode(server), config=sconf)
        plain = await listen("tls://127.0.0.1:0", server, EchoNode(server), config=TransportConfig(**base))
        async with lst, plain:
            url = lst.addresses[0]
            conn = await dial(url, client, expect=server.agent_id, config=cconf)
            await roundtrip(conn, client)
            await conn.close()
            # a client without a CA-signed certificate is refused by the TLS layer
            with pytest.raises(TransportError):
                conn = await dial(url, client, expect=server.agent_id, config=TransportConfig(**base))
                await roundtrip(conn, client)
            # a certificate from another CA is refused
            with pytest.raises(TransportError):
                conn = await dial(url, client, expect=server.agent_id, config=stranger)
                await roundtrip(conn, client)
            # a CA-mode client refuses a self-signed server
            with pytest.raises(TransportError):
                await dial(plain.addresses[0], client, expect=server.agent_id, config=cconf)

    run(main())


def test_ca_mode_over_quic(tmp_path: Path) -> None:
    """QUIC in CA mode: the client verifies the server's chain (aioquic servers cannot ask for
    client certificates, so the client's identity rests on the signed HELLO alone)."""
    d = tmp_path / "certs"
    init_ca(d, ["alpha", "beta"])
    server, client = Identity.generate(), Identity.generate()
    base = {"handshake_timeout": 3.0, "linger_timeout": 0.3}
    sconf = TransportConfig(
        ca_file=str(d / "ca.pem"), cert_file=str(d / "alpha.pem"), key_file=str(d / "alpha.key"), **base
    )
    cconf = TransportConfig(
        ca_file=str(d / "ca.pem"), cert_file=str(d / "beta.pem"), key_file=str(d / "beta.key"), **base
    )

    async def main() -> None:
        lst = await listen("quic://127.0.0.1:0", server, EchoNode(server), config=sconf)
        plain = await listen("quic://127.0.0.1:0", server, EchoNode(server), config=TransportConfig(**base))
        async with lst, plain:
            conn = await dial(lst.addresses[0], client, expect=server.agent_id, config=cconf)
            await roundtrip(conn, client)
            await conn.close()
            # a CA-mode client refuses a server whose certificate is self-signed
            with pytest.raises(TransportError):
                await dial(plain.addresses[0], client, expect=server.agent_id, config=cconf)

    run(main())
