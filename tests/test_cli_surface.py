"""The command line's small things, as a user meets them (real processes): ``--payload @FILE`` and
``-``, ``send --ack`` to a node that refuses the handshake, Ctrl-C in ``send-file``, ``--metrics`` on
a port in use, a bad ``--https-cert``, ``a2a card`` against a node without A2A, ``proto list``
without protoc. Each failure is one line on stderr naming the fix."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iac.cli.options import MAX_PAYLOAD_FILE, payload_arg
from iac.errors import ConfigError
from iac.wire.identity import Identity

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}

#: A node whose RUN handler echoes the payload (not an A2A agent): prints ``ready ID URL``.
ECHO = """
import asyncio, sys
import iac

async def main() -> None:
    async with iac.Node(listen="tls://127.0.0.1:0") as node:
        node.on("RUN")(lambda ctx: ctx.payload)
        print("ready", node.agent_id, node.addresses[0], flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def iac(*args: str, stdin: str | None = None, timeout: float = 30.0, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], input=stdin, capture_output=True, text=True, timeout=timeout,
        env=env or ENV,
    )  # fmt: skip


def one_line(out: subprocess.CompletedProcess[str], *texts: str) -> str:
    assert out.returncode != 0, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for text in texts:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("keys") / "alice.key"
    assert iac("keygen", "--out", str(path)).returncode == 0
    return str(path)


@pytest.fixture(scope="module")
def echo() -> Iterator[tuple[str, str]]:
    proc = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        word, agent_id, url = proc.stdout.readline().split()
        assert word == "ready"
        yield agent_id, url
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_payload_from_a_file_and_from_standard_input(key: str, echo: tuple[str, str], tmp_path: Path) -> None:
    agent_id, url = echo
    target = ["--key", key, "--to", agent_id, "--addr", url]
    (tmp_path / "p.json").write_text('{"text": "from a file"}\n')
    out = iac("request", *target, "--payload", f"@{tmp_path / 'p.json'}")
    assert out.returncode == 0 and out.stdout.strip() == '{"text":"from a file"}', out.stderr
    out = iac("request", *target, "--payload", "-", stdin='["from", "stdin"]')
    assert out.returncode == 0 and out.stdout.strip() == '["from","stdin"]', out.stderr


def test_payload_file_errors_are_one_line(
    key: str, echo: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id, url = echo
    out = iac(
        "send", "--key", key, "--to", agent_id, "--addr", url, "--payload", f"@{tmp_path / 'nope.json'}"
    )
    one_line(out, f"--payload @{tmp_path / 'nope.json'}: no such file", "needs no @")
    with pytest.raises(ConfigError, match="is a directory"):
        payload_arg(f"@{tmp_path}")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad.json: not JSON \(Expecting"):
        payload_arg(f"@{tmp_path / 'bad.json'}")
    (tmp_path / "big.json").write_bytes(b'"' + b"x" * MAX_PAYLOAD_FILE + b'"')
    with pytest.raises(ConfigError, match=f"more than {MAX_PAYLOAD_FILE} bytes.*iac send-file"):
        payload_arg(f"@{tmp_path / 'big.json'}")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe")))
    with pytest.raises(ConfigError, match=r"--payload - \(standard input\): not UTF-8"):
        payload_arg("-")


def test_send_ack_names_a_refused_handshake_at_once(key: str, echo: tuple[str, str]) -> None:
    _, url = echo
    other = Identity.generate().agent_id  # the node there is someone else
    out = iac("send", "--key", key, "--to", other, "--addr", url, "--ack", "--timeout", "20", timeout=15)
    one_line(out, "wrong_peer", "refused the handshake")
    assert "no ACK" not in out.stderr


def test_ctrl_c_in_send_file_says_a_rerun_resumes(key: str, tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 100_000)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP, never speaks TLS
        port = silent.getsockname()[1]
        other = Identity.generate().agent_id
        proc = subprocess.Popen(
            [sys.executable, "-m", "iac", "send-file", "--key", key, "--to", other,
             "--addr", f"tls://127.0.0.1:{port}", str(tmp_path / "f.bin"), "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )  # fmt: skip
        try:
            silent.settimeout(30)
            conn, _ = silent.accept()  # send-file is dialing: the transfer has started
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            conn.close()
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert (
        len(lines) == 1 and "interrupted" in lines[0] and "run the same command again to resume" in lines[0]
    )
    assert out == ""


def test_metrics_on_a_port_in_use_names_metrics(key: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = iac(
            "node",
            "--key",
            key,
            "--listen",
            "tls://127.0.0.1:0",
            "--no-admin",
            "--metrics",
            f"127.0.0.1:{port}",
        )
    line = one_line(out, f"--metrics 127.0.0.1:{port}: the address is in use", "port 0")
    assert "--listen" not in line


def test_a2a_gateway_with_a_missing_or_bad_pem_is_one_line(key: str, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("alice s3cret-token-0123456789abcdef\n")
    (tmp_path / "tokens").chmod(0o600)
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    gateway = ["a2a", "gateway", "--key", key, "--listen", "https://127.0.0.1:0",
               "--to", Identity.generate().agent_id, "--addr", "tls://127.0.0.1:9",
               "--tokens", str(tmp_path / "tokens")]  # fmt: skip
    bad = str(tmp_path / "bad.pem")
    one_line(
        iac(*gateway, "--https-cert", bad, "--https-key", bad), "not a PEM certificate and its private key"
    )
    one_line(
        iac(*gateway, "--https-cert", str(tmp_path / "no.pem"), "--https-key", bad),
        "--https-cert",
        "no such file",
    )


def test_a2a_card_against_a_node_without_a2a_says_so(key: str, echo: tuple[str, str]) -> None:
    agent_id, url = echo
    out = iac("a2a", "card", "--key", key, "--to", agent_id, "--addr", url, "--timeout", "10")
    line = one_line(out, "serves no A2A over IAC")
    assert "neither a result nor an error" not in line


def test_proto_list_knows_grpcio_tools_covers_python(tmp_path: Path) -> None:
    hidden = (
        "import sys; sys.modules['grpc_tools'] = None; from iac.cli.main import main; "
        "sys.exit(main(['proto', 'list']))"
    )
    env = {**ENV, "PATH": str(tmp_path)}  # no protoc on PATH
    out = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, timeout=30, env=env)
    python = next(line for line in out.stdout.splitlines() if line.startswith("python "))
    assert "missing" in python and "pip install grpcio-tools" in python, python
    out = iac(
        "proto", "list", env={**ENV, "PATH": str(tmp_path)}
    )  # grpcio-tools installed: enough for python
    python = next(line for line in out.stdout.splitlines() if line.startswith("python "))
    assert "available" in python and "grpcio-tools" in python, python
