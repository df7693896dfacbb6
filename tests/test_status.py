"""The status socket (iac.integrations.admin) and `iac status` against a real node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run

import iac
from iac.cli.status import render
from iac.errors import ConfigError, RemoteError, TransportError
from iac.integrations.admin import AdminSocket, default_path, fetch_status, private_dir, runtime_dir

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
NOBODY = 65534


async def iac_status(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`iac status ARGS` as a process, while this loop keeps serving the node."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "iac", "status", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env or ENV,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def traffic(alice: iac.Node, bob: iac.Node) -> None:
    """Three answered requests and one refused (no handler) from alice to bob."""
    alice.add_peer(bob.agent_id, *bob.addresses)
    for i in range(3):
        await alice.request(bob.agent_id, iac.MessageType.RUN, i, timeout=5)
    with pytest.raises(RemoteError):
        await alice.request(bob.agent_id, iac.MessageType.CREATE, "?", timeout=5)


def test_iac_status_json_matches_node_stats(sockdir: Path) -> None:
    path = sockdir / "admin" / "bob.sock"

    async def main() -> None:
        admin = AdminSocket(path)
        async with iac.Node(listen=["tls://127.0.0.1:0"], metrics=admin) as bob, iac.Node() as alice:
            bob.on(iac.MessageType.RUN)(lambda ctx: ctx.payload)
            await traffic(alice, bob)
            code, out, err = await iac_status("--json", "--admin", str(path))
            assert code == 0, err
            answer = json.loads(out)
            s = bob.stats()
            assert answer["agent_id"] == bob.agent_id and answer["addresses"] == bob.addresses
            assert answer["pid"] == os.getpid()
            got = answer["stats"]
            for name in ("received", "sent", "handled", "replies_sent", "connections", "backlog", "running"):
                assert got[name] == getattr(s, name), name
            assert got["refused"] == dict(s.refused) and got["refused"]["no_handler"] == 1
            assert got["errors_sent"] == dict(s.errors_sent)
            assert got["peer_state"] == dict(s.peer_state)
            assert set(got["peer_links"]) == set(s.peer_links) == {alice.agent_id}
            link, expected = got["peer_links"][alice.agent_id], s.peer_links[alice.agent_id]
            for key in ("connected", "transport", "address", "in_flight", "rtt_ms"):
                assert link[key] == expected[key], key
            assert link["connected"] and link["transport"] == "tls"
            # the text view: peers with their prefix, transport and address, queues, refusals
            code, out, err = await iac_status("--admin", str(path))
            assert code == 0, err
            assert f"node {bob.agent_id}" in out and "connections 1" in out
            row = next(line for line in out.splitlines() if line.strip().startswith(alice.agent_id[:16]))
            assert "tls" in row.split() and expected["address"] in row
            assert "refused  no_handler 1" in out
            assert f"handled {s.handled}" in out and "queues  running 0  backlog 0" in out
        assert not path.exists()  # removed when the node closed

    run(main(), timeout=90)


def test_socket_mode_0600_in_a_0700_directory(sockdir: Path) -> None:
    path = sockdir / "fresh" / "deep" / "n.sock"

    async def main() -> None:
        async with iac.Node() as node:
            detach = AdminSocket(path).attach(node)
            try:
                assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
                assert stat.S_ISSOCK(path.stat().st_mode)
                assert stat.S_IMODE(path.stat().st_mode) == 0o600
                answer = await asyncio.to_thread(fetch_status, path)
                assert answer["agent_id"] == node.agent_id
            finally:
                detach()

    run(main())


def test_a_directory_others_can_enter_is_refused(sockdir: Path) -> None:
    shared = sockdir / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ConfigError, match="mode 0700"):
        private_dir(shared)

    async def main() -> None:
        async with iac.Node() as node:
            with pytest.raises(ConfigError, match="must be private"):
                AdminSocket(shared / "n.sock").attach(node)

    run(main())


def test_a_second_node_on_the_same_socket_is_refused_and_a_stale_one_replaced(sockdir: Path) -> None:
    path = sockdir / "run" / "n.sock"

    async def main() -> None:
        async with iac.Node() as a, iac.Node() as b:
            detach = AdminSocket(path).attach(a)
            with pytest.raises(ConfigError, match="another node serves its status there"):
                AdminSocket(path).attach(b)
            detach()
            stale = socket.socket(socket.AF_UNIX)  # bound, never listening: a node that died
            stale.bind(str(path))
            stale.close()
            detach = AdminSocket(path).attach(b)
            answer = await asyncio.to_thread(fetch_status, path)
            assert answer["agent_id"] == b.agent_id
            detach()

    run(main())


def _connect_as(uid: int, path: Path) -> tuple[str, bytes]:
    """Fork a child that drops to ``uid`` and asks ``path`` for the status; what happened."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no exec, just a socket
        os.close(r)
        outcome = b"ok:"
        try:
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(str(path))
            s.sendall(b"status\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            outcome += data
        except OSError as exc:
            outcome = f"err:{type(exc).__name__}".encode()
        os.write(w, outcome[:60000])
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    kind, _, rest = data.partition(b":")
    return kind.decode(), rest


@pytest.mark.skipif(os.getuid() != 0, reason="changing to another uid needs root")
def test_a_client_of_another_uid_gets_nothing(sockdir: Path) -> None:
    path = sockdir / "priv" / "n.sock"
    sockdir.chmod(0o755)  # so the other uid reaches priv/ (which stays 0700)

    async def main() -> None:
        async with iac.Node() as node:
            admin = AdminSocket(path)
            detach = admin.attach(node)
            try:
                # the private directory stops it before the socket
                kind, rest = await asyncio.to_thread(_connect_as, NOBODY, path)
                assert (kind, rest) == ("err", b"PermissionError")
                # with the directory and socket opened up, SO_PEERCRED still does: closed unanswered
                path.parent.chmod(0o755)
                path.chmod(0o666)
                kind, rest = await asyncio.to_thread(_connect_as, NOBODY, path)
                assert (kind, rest) in {
                    ("ok", b""),
                    ("err", b"ConnectionResetError"),
                    ("err", b"BrokenPipeError"),
                }
                assert admin.refused == 1
                # this process's uid is answered
                assert (await asyncio.to_thread(fetch_status, path))["agent_id"] == node.agent_id
            finally:
                detach()

    run(main(), timeout=60)


def test_fetch_status_names_the_fix(sockdir: Path) -> None:
    with pytest.raises(TransportError, match="is the node running"):
        fetch_status(sockdir / "none.sock")
    dead = sockdir / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    with pytest.raises(TransportError, match="its node stopped"):
        fetch_status(dead)


def test_the_default_path_is_under_the_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runtime_dir() == tmp_path / "iac"
    assert default_path("ab" * 32) == tmp_path / "iac" / f"{'ab' * 8}.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert runtime_dir() == tmp_path / "home" / ".iac" / "run"


def test_render_without_peers_or_refusals() -> None:
    text = render({"agent_id": "ab" * 32, "pid": 1, "uptime_s": 3725, "addresses": [], "stats": {}})
    assert "up 1h02m05s" in text and "peers 0" in text and "refused  none" in text


def test_iac_node_serves_status_by_default_and_iac_status_finds_it(tmp_path: Path) -> None:
    """`iac node` with XDG_RUNTIME_DIR set: `status PATH` under it, and `iac status` with no
    --admin finds the one node there; `--watch` prints again until Ctrl-C (exit 0)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {**ENV, "XDG_RUNTIME_DIR": str(runtime)}
    key = tmp_path / "n.key"
    ident = iac.Identity.generate()
    ident.save(key)
    node = subprocess.Popen(
        [sys.executable, "-m", "iac", "node", "--key", str(key), "--listen", "tls://127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert node.stdout is not None
        lines: dict[str, Any] = {}
        while "status" not in lines:
            line = node.stdout.readline()
            assert line, node.stderr.read() if node.stderr else ""
            kind, _, value = line.strip().partition(" ")
            lines[kind] = value
        path = Path(lines["status"])
        assert path == runtime / "iac" / f"{ident.agent_id[:16]}.sock"
        out = subprocess.run(
            [sys.executable, "-m", "iac", "status", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["agent_id"] == ident.agent_id
        watch = subprocess.Popen(
            [sys.executable, "-m", "iac", "status", "--watch", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert watch.stdout is not None
        seen = 0
        while seen < 2:
            line = watch.stdout.readline()
            assert line
            seen += line.startswith("node ")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=20) == 0
        for stream in (watch.stdout, watch.stderr):
            if stream is not None:
                stream.close()
    finally:
        node.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=20)
        if node.poll() is None:
            node.kill()
        for stream in (node.stdout, node.stderr):
            if stream is not None:
                stream.close()
    assert not path.exists()
