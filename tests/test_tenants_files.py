"""Files on disk cannot be turned against the node that writes them: every file the library writes
goes through a fresh 0600 temporary file and a rename (a planted link or file is never written
through, a planted mode never kept); a damaged or unsafe session ticket file costs one WARNING and
a full handshake, never a failed dial; a bad key or tokens file is one line and exit 1."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run

from iac import Identity, Node, NodeConfig
from iac.errors import ConfigError
from iac.integrations.a2a.auth import GatewayAuth
from iac.wire.private import read_private, write_private

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
NOBODY = 65534


def test_write_private_never_writes_through_a_planted_link_and_never_keeps_a_planted_mode(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    target = tmp_path / "tickets.json"
    # links at the names a writer might use for its temporary file, and at the target itself
    for name in ("tickets.json.tmp", ".tickets.json.tmp"):
        (tmp_path / name).symlink_to(victim)
    target.write_text("{}")
    target.chmod(0o666)
    write_private(target, b'{"new": 1}')
    assert victim.read_text() == "untouched"
    assert target.read_bytes() == b'{"new": 1}' and not target.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    target.unlink()
    target.symlink_to(victim)
    write_private(target, b"x")  # the rename replaces the link, not what it points to
    assert victim.read_text() == "untouched" and not target.is_symlink()
    with pytest.raises(FileExistsError):
        write_private(target, b"y", overwrite=False)
    assert target.read_bytes() == b"x"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".tickets.json.tmp", "tickets.json", "tickets.json.tmp", "victim"]  # no temporary left


def test_read_private_refuses_links_other_modes_other_owners_and_large_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    write_private(f, b"ok")
    assert read_private(f, 10) == b"ok"
    with pytest.raises(ConfigError, match="larger than"):
        read_private(f, 1)
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(ConfigError, match="symbolic link"):
        read_private(link, 10)
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644"):
        read_private(f, 10)
    if os.geteuid() == 0:
        f.chmod(0o600)
        os.chown(f, NOBODY, NOBODY)
        with pytest.raises(ConfigError, match="owned by uid"):
            read_private(f, 10)


def test_keys_and_certificate_keys_are_written_0600_whatever_was_planted(tmp_path: Path) -> None:
    key = tmp_path / "a.key"
    key.write_text("planted")
    key.chmod(0o666)
    ident = Identity.generate()
    ident.save(key, overwrite=True)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert Identity.load(key).agent_id == ident.agent_id


DAMAGED = {
    "list": b"[]",
    "string": b'"tickets"',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep_object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "entry_not_object": b'{"quic://127.0.0.1:1": 5}',
    "bad_types": json.dumps(
        {"quic://127.0.0.1:1": {"ticket": [], "cert_sha256": "00", "agent_id": 3}}
    ).encode(),
    "not_utf8": b"\xff\xfe{}",
    "not_json": b"{tick",
}


def _dial_with(tmp_path: Path, tickets: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """A QUIC dial from a node whose ticket file is ``tickets``: answered (a full handshake);
    the WARNING lines the ticket store logged."""

    async def main() -> None:
        async with Node(listen="quic://127.0.0.1:0") as bob:
            bob.on("RUN")(lambda ctx: "ok")
            async with Node(Identity.generate(), config=NodeConfig(tickets_file=tickets)) as alice:
                alice.add_peer(bob.agent_id, *bob.addresses)
                reply = await alice.request(bob.agent_id, "RUN", {}, timeout=10)
                assert reply.payload == "ok"
                assert alice.stats().zero_rtt["resumed"] == 0

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="iac"):
        run(main(), timeout=30)
    return [r.getMessage() for r in caplog.records if r.name == "iac.transport.quic"]


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_a_damaged_ticket_file_costs_one_warning_and_a_full_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    tickets = tmp_path / "tickets.json"
    write_private(tickets, DAMAGED[kind])
    lines = _dial_with(tmp_path, tickets, caplog)
    assert len(lines) == 1 and "session tickets not used" in lines[0], lines
    assert stat.S_IMODE(tickets.stat().st_mode) == 0o600


def test_a_ticket_file_open_to_others_or_of_another_owner_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tickets = tmp_path / "tickets.json"
    tickets.write_text("{}")
    tickets.chmod(0o666)  # planted: anyone could read the secrets written into it, or plant some
    lines = _dial_with(tmp_path, tickets, caplog)
    assert len(lines) == 1 and "mode 0666" in lines[0], lines
    # the file written since is a fresh one of this user's, mode 0600
    assert stat.S_IMODE(tickets.stat().st_mode) == 0o600 and json.loads(tickets.read_text())
    if os.geteuid() == 0:
        other = tmp_path / "other.json"
        other.write_text("{}")
        other.chmod(0o600)
        os.chown(other, NOBODY, NOBODY)
        lines = _dial_with(tmp_path, other, caplog)
        assert len(lines) == 1 and "owned by uid" in lines[0], lines


def _iac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, env=ENV, timeout=60
    )


def test_bad_key_and_tokens_files_are_one_line_and_exit_1(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    Identity.generate().save(key)
    tokens = tmp_path / "tokens"
    write_private(tokens, b"alice \xff\xfe-not-utf8-secret-1234\n")
    agent = Identity.generate().agent_id
    gateway = ["a2a", "gateway", "--key", str(key), "--listen", "http://127.0.0.1:0", "--to", agent]
    cases = {"tokens not UTF-8": ([*gateway, "--tokens", str(tokens)], "not UTF-8")}
    open_key = tmp_path / "open.key"
    Identity.generate().save(open_key)
    open_key.chmod(0o644)
    cases["key open to others"] = (["id", "--key", str(open_key)], "chmod 600")
    binary_key = tmp_path / "bin.key"
    write_private(binary_key, b"\xff\xfe\x00binary")
    cases["binary key"] = (["id", "--key", str(binary_key)], "not an IAC key file")
    for what, (args, needle) in cases.items():
        out = _iac(*args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1, (what, out.stderr)
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, (what, out.stderr)
    with pytest.raises(ConfigError, match="not UTF-8"):
        GatewayAuth.from_file(tokens)
