"""One tenant cannot take what the others need from a node's operations surfaces: the metrics
endpoint (at most 4 of its 16 slots per client address) and the status socket (a request line
within 1 s; a new client takes the slot of the longest idle one), each against a real `iac node`
process while the attack runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from conftest import run

import iac
from iac.integrations.admin import MAX_CLIENTS as STATUS_SLOTS
from iac.integrations.admin import READ_TIMEOUT, AdminSocket, fetch_status
from iac.integrations.scrape import MAX_CLIENTS, MAX_PER_ADDRESS
from iac.testing.waiting import eventually_sync

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
#: Every honest attempt is answered within this many seconds while the attack runs.
DEADLINE = 5.0


@contextlib.contextmanager
def iac_node(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """`iac node` as a process; its `KIND VALUE` lines up to `node`'s last one."""
    key = tmp_path / "n.key"
    iac.Identity.generate().save(key)
    cmd = [sys.executable, "-m", "iac", "node", "--key", str(key), "--listen", "tls://127.0.0.1:0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        lines: dict[str, str] = {}
        want = {"node", "listening"}
        want |= {"metrics"} if "--metrics" in extra else set()
        want |= set() if "--no-admin" in extra else {"status"}
        while not want <= set(lines):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            kind, _, value = line.strip().partition(" ")
            lines[kind] = value
        yield proc, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the other end closed ``s`` (EOF or reset pending), without waiting."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_one_address_holding_idle_sockets_gets_4_metrics_slots_and_scrapes_are_answered(
    tmp_path: Path,
) -> None:
    with iac_node(tmp_path, "--metrics", "127.0.0.1:0", "--no-admin") as (_proc, lines):
        url = lines["metrics"]
        host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
        idle: list[socket.socket] = []
        try:
            for _ in range(MAX_CLIENTS + 1):  # 17 idle sockets, all from 127.0.0.2
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect((host, int(port)))
                s.sendall(b"GET /met")  # a head that never ends
                idle.append(s)

            def held() -> list[socket.socket]:
                return [s for s in idle if not _closed_by_peer(s)]

            # the endpoint closes all but MAX_PER_ADDRESS of them at once
            eventually_sync(lambda: len(held()) == MAX_PER_ADDRESS, timeout=DEADLINE)
            for _ in range(5):
                started = time.monotonic()
                with urllib.request.urlopen(url, timeout=DEADLINE) as resp:
                    assert resp.status == 200 and b"iac_messages_sent" in resp.read()
                assert time.monotonic() - started < DEADLINE
            assert len(held()) == MAX_PER_ADDRESS  # the bound held all along
        finally:
            for s in idle:
                s.close()


def test_idle_same_uid_clients_cannot_make_iac_status_fail(tmp_path: Path) -> None:
    sock = tmp_path / "adm"
    sock.mkdir(mode=0o700)
    path = sock / "n.sock"
    with iac_node(tmp_path, "--admin", str(path)) as (_proc, lines):
        assert lines["status"] == str(path)

        async def attack(stop: asyncio.Event, opened: list[int]) -> None:
            """12 idle clients, each connecting again as soon as it is closed."""

            async def one() -> None:
                while not stop.is_set():
                    reader, writer = await asyncio.open_unix_connection(str(path))
                    opened[0] += 1
                    with contextlib.suppress(ConnectionError):
                        await reader.read()  # idle until the node closes it
                    writer.close()

            await asyncio.gather(*(one() for _ in range(STATUS_SLOTS + 4)))

        async def main() -> None:
            stop = asyncio.Event()
            opened = [0]
            attacker = asyncio.create_task(attack(stop, opened))
            try:
                while opened[0] < STATUS_SLOTS + 4:
                    await asyncio.sleep(0.01)
                for _ in range(5):
                    started = time.monotonic()
                    answer = await asyncio.to_thread(fetch_status, path, DEADLINE)
                    assert answer["agent_id"] == lines["node"]
                    assert time.monotonic() - started < DEADLINE
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "iac", "status", "--admin", str(path),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
                )  # fmt: skip
                out, err = await proc.communicate()
                assert proc.returncode == 0, err.decode()
                assert f"node {lines['node']}" in out.decode()
                # idle clients were closed within the 1 s a request line may take, or for a newcomer
                assert opened[0] > STATUS_SLOTS + 4
            finally:
                stop.set()
                attacker.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await attacker

        run(main(), timeout=60)


def test_a_status_client_that_sends_nothing_is_closed_after_the_read_timeout(sockdir: Path) -> None:
    path = sockdir / "a" / "n.sock"

    async def main() -> None:
        async with iac.Node() as node:
            detach = AdminSocket(path).attach(node)
            try:
                reader, writer = await asyncio.open_unix_connection(str(path))
                # closed unanswered once READ_TIMEOUT (1 s) passed, well before this wait ends
                assert await asyncio.wait_for(reader.read(), 3 * READ_TIMEOUT) == b""
                writer.close()
            finally:
                detach()

    run(main())
