"""`iac registry`, `iac send`, `iac request` and `iac call` as a user runs them (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Nodes serve their status socket in a directory of their own, not in the user's runtime dir.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}


IAC = [sys.executable, "-m", "iac"]

# A small agent process: publishes itself (alias, capability) to the registries given on the
# command line, answers RUN with an echo and exposes add().
TARGET = """
import asyncio, signal, sys
from iac import Identity, MessageType, Node
from iac.mesh import MeshClient, parse_registry

async def main() -> None:
    key, alias, *registries = sys.argv[1:]
    async with Node(Identity.load(key), listen=["tls://127.0.0.1:0"]) as node:
        @node.on(MessageType.RUN)
        async def run(ctx):
            return {"echo": ctx.payload, "from": ctx.sender}

        node.expose(lambda a, b: a + b, name="add")
        async with MeshClient(node, registries=parse_registry(registries), aliases=[alias],
                              capabilities=["echo"]):
            print("ready", node.agent_id, node.addresses[0], flush=True)
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()

asyncio.run(main())
"""


def iac(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IAC, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


class Proc:
    def __init__(self, cmd: list[str], cwd: Path | None = None) -> None:
        self.p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd
        )

    def line(self) -> list[str]:
        assert self.p.stdout is not None
        text = self.p.stdout.readline()
        if not text:
            assert self.p.stderr is not None
            raise AssertionError(f"process ended: {self.p.stderr.read()}")
        return text.split()

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        for s in (self.p.stdout, self.p.stderr):
            if s is not None:
                s.close()


def start_registry(key: Path, store: str, cwd: Path | None = None) -> tuple[Proc, str]:
    """An `iac registry` process; returns it and its ``ID@URL``."""
    proc = Proc([*IAC, "registry", "--key", str(key), "--listen", "tls://127.0.0.1:0", "--store", store], cwd)
    kind, rid = proc.line()
    assert kind == "registry"
    assert proc.line() == ["store", store]
    kind, url = proc.line()
    assert kind == "listening"
    return proc, f"{rid}@{url}"


def start_target(tmp_path: Path, key: Path, alias: str, *registries: str) -> tuple[Proc, str, str]:
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = Proc([sys.executable, str(script), str(key), alias, *registries])
    kind, tid, addr = proc.line()
    assert kind == "ready"
    return proc, tid, addr


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("reg", "reg2", "target", "me"):
        out[name] = tmp_path / f"{name}.key"
        assert iac("keygen", "--out", str(out[name])).returncode == 0
    return out


@pytest.fixture
def mesh(tmp_path: Path, keys: dict[str, Path]) -> Iterator[dict[str, str]]:
    """A registry on the default embedded store (SQLite in the working directory) and a target."""
    reg, spec = start_registry(keys["reg"], "sqlite:./iac-registry.db", cwd=tmp_path)
    try:
        target, tid, addr = start_target(tmp_path, keys["target"], "target.test", spec)
        try:
            yield {"registry": spec, "id": tid, "addr": addr}
        finally:
            target.stop()
    finally:
        reg.stop()
    assert (tmp_path / "iac-registry.db").exists()


def test_help_on_each_verb() -> None:
    for verb in ("registry", "send", "request", "call"):
        out = iac(verb, "--help")
        assert out.returncode == 0 and f"usage: iac {verb}" in out.stdout
        assert "--key" in out.stdout
    for verb in ("send", "request", "call"):
        out = iac(verb, "--help").stdout
        assert all(flag in out for flag in ("--to", "--addr", "--registry", "--timeout"))


def test_request_call_and_send_through_the_registry(keys: dict[str, Path], mesh: dict[str, str]) -> None:
    me = str(keys["me"])
    reg = ["--registry", mesh["registry"]]
    out = iac(
        "request", "--key", me, "--to", "target.test", *reg, "--type", "RUN", "--payload", '{"x": [1, 2]}'
    )
    assert out.returncode == 0, out.stderr
    import json

    reply = json.loads(out.stdout)
    assert reply["echo"] == {"x": [1, 2]} and len(reply["from"]) == 64

    out = iac("call", "--key", me, "--to", "target.test", "--registry", mesh["registry"], "add", "2", "40")
    assert (out.returncode, out.stdout.strip()) == (0, "42"), out.stderr
    # by AgentId and address, no registry
    out = iac(
        "call",
        "--key",
        me,
        "--to",
        mesh["id"],
        "--addr",
        mesh["addr"],
        "add",
        '"a"',
        "--kwargs",
        '{"b": "z"}',
    )
    assert (out.returncode, out.stdout.strip()) == (0, '"az"'), out.stderr
    out = iac("send", "--key", me, "--to", mesh["id"], *reg, "--type", "run", "--payload", "{}", "--ack")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"sent {mesh['id']} RUN session_id=0x") and out.stdout.strip().endswith(
        "acked"
    )


def test_a_published_node_with_an_inbox_takes_files(
    tmp_path: Path, keys: dict[str, Path], mesh: dict[str, str]
) -> None:
    """`iac node --registry ... --inbox DIR`: published (found by its alias) and taking files."""
    inbox = tmp_path / "inbox"
    node = Proc(
        [*IAC, "node", "--key", str(keys["reg2"]), "--listen", "tls://127.0.0.1:0",
         "--registry", mesh["registry"], "--alias", "files.test", "--inbox", str(inbox)]
    )  # fmt: skip
    try:
        kind, node_id = node.line()
        assert kind == "node"
        kind, addr = node.line()
        assert kind == "listening"
        assert node.line() == ["inbox", str(inbox)]
        assert node.line()[0] == "status"  # the status socket for `iac status`
        me = str(keys["me"])
        out = iac(
            "request", "--key", me, "--to", "files.test", "--registry", mesh["registry"], "--type", "RUN"
        )
        # found through the registry, and it has no RUN handler
        assert out.returncode == 1 and "no_handler" in out.stderr, out.stderr
        src = tmp_path / "notes.txt"
        src.write_text("minutes\n" * 1000)
        out = iac("send-file", "--key", me, "--to", node_id, "--addr", addr, str(src), "--quiet")
        assert out.returncode == 0, out.stderr
        assert node.line()[:3] == ["received", "notes.txt", "8000"]
        assert (inbox / "notes.txt").read_text() == src.read_text()
    finally:
        node.stop()


def test_errors_are_one_line_and_a_non_zero_exit(keys: dict[str, Path], mesh: dict[str, str]) -> None:
    me, reg = str(keys["me"]), mesh["registry"]
    cases = [
        (["request", "--key", me, "--to", "Not An Id!", "--registry", reg], "neither a valid AgentId"),
        # 64 hex characters, but the identity point (small order): not an AgentId
        (["request", "--key", me, "--to", "01" + "00" * 31, "--registry", reg], "not a valid AgentId"),
        (["request", "--key", me, "--to", "nobody.test", "--registry", reg], "no agent has the alias"),
        (["request", "--key", me, "--to", "target.test"], "add --registry"),
        (
            ["request", "--key", me, "--to", "target.test", "--registry", reg, "--payload", "{oops"],
            "not JSON",
        ),
        (
            ["send", "--key", me, "--to", "target.test", "--registry", reg, "--type", "ACK"],
            "not a message type",
        ),
        (["call", "--key", me, "--to", "target.test", "--registry", reg, "nope"], "no_handler"),
        (
            ["call", "--key", me, "--to", mesh["id"], "--addr", "tls://127.0.0.1:9", "add", "1", "2"],
            "cannot reach",
        ),
        (["call", "--key", me, "--to", "target.test", "--registry", "abc@tls://x:1", "add"], "AGENT_ID@URL"),
    ]
    for argv, text in cases:
        out = iac(*argv)
        assert out.returncode == 1, (argv, out)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (argv, out.stderr)
        assert lines[0].startswith(f"iac {argv[0]}: error: ")


def test_two_registry_processes_share_one_redis(
    tmp_path: Path, keys: dict[str, Path], redis_url: str
) -> None:
    store = redis_url.rsplit("/", 1)[0] + "/3"  # a database of its own on the shared test server
    r1, spec1 = start_registry(keys["reg"], store)
    r2, spec2 = start_registry(keys["reg2"], store)
    try:
        # the target publishes through the first registry only ...
        target, _, _ = start_target(tmp_path, keys["target"], "shared.test", spec1)
        try:
            # ... and is found through the second
            out = iac(
                "call", "--key", str(keys["me"]), "--to", "shared.test", "--registry", spec2, "add", "1", "2"
            )
            assert (out.returncode, out.stdout.strip()) == (0, "3"), out.stderr
        finally:
            target.stop()
    finally:
        r1.stop()
        r2.stop()


def test_a_node_restarted_with_its_ticket_file_resumes_in_0rtt(tmp_path: Path, keys: dict[str, Path]) -> None:
    """`iac node --tickets FILE --registry ID@quic://...`: the registry's session ticket is kept
    in FILE (mode 0600); the node run again dials the registry with it, in 0-RTT, and
    `iac status --json` counts the early data the registry accepted."""
    reg = Proc([*IAC, "registry", "--key", str(keys["reg"]), "--listen", "quic://127.0.0.1:0",
                "--store", "memory"], tmp_path)  # fmt: skip
    try:
        kind, rid = reg.line()
        assert kind == "registry" and reg.line() == ["store", "memory"]
        kind, url = reg.line()
        assert kind == "listening" and url.startswith("quic://")
        tickets = tmp_path / "tickets.json"
        cmd = [*IAC, "node", "--key", str(keys["me"]), "--listen", "tls://127.0.0.1:0",
               "--registry", f"{rid}@{url}", "--tickets", str(tickets)]  # fmt: skip
        for run in ("first", "restarted"):
            node = Proc(cmd)
            try:
                lines: dict[str, list[str]] = {}
                while "status" not in lines:
                    kind, *rest = node.line()
                    lines[kind] = rest
                status = ["status", "--admin", lines["status"][0], "--json"]
                if run == "first":
                    deadline = time.monotonic() + 10
                    while url not in (tickets.read_text() if tickets.exists() else ""):
                        assert time.monotonic() < deadline, "no session ticket saved"
                        time.sleep(0.05)  # polls a file another process writes
                    assert tickets.stat().st_mode & 0o077 == 0
                    zero = json.loads(iac(*status).stdout)["stats"]["zero_rtt"]
                    assert zero["early_dials"] == 0
                else:
                    zero = json.loads(iac(*status).stdout)["stats"]["zero_rtt"]
                    assert zero["early_dials"] == 1 and zero["early_accepted"] == 1 and zero["resumed"] == 1
            finally:
                node.stop()
        (tmp_path / "shared.json").write_text("{}")
        (tmp_path / "shared.json").chmod(0o644)
        out = iac("node", "--key", str(keys["me"]), "--listen", "tls://127.0.0.1:0",
                  "--tickets", str(tmp_path / "shared.json"))  # fmt: skip
        assert out.returncode == 1 and "readable by others" in out.stderr and "Traceback" not in out.stderr
    finally:
        reg.stop()
