"""Every verb of the ``iac`` command given bad arguments, as a user runs it (real processes).

Each case must end with a non-zero exit and exactly one line on stderr that starts with
``iac VERB: error:``, names the fix (the case's own words, not a generic text), and shows no
Python exception class and no internal parameter name. The verbs come from the parser itself, so
a new verb without a case here fails :func:`test_every_verb_has_a_bad_argument_case`.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from iac.cli.main import build_parser
from iac.wire.identity import Identity

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = str(ROOT / "iac" / "bench" / "corpus" / "train.jsonl")
#: 64 hex digits, but the identity point (small order): not an AgentId.
SMALL_ORDER = "01" + "00" * 31
AGENT_ID_TEXT = "not a valid AgentId (64 lowercase hex digits of an Ed25519 public key)"
TASK = '{"task_id": "t1", "intent": "ASSIGN_TASK", "step": 1, "steps": 1}'

#: Python exception class names, and any word shaped like one.
CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*(Error|Exception|Warning|Interrupt|Exit)\b")
#: Parameter names of the library that a user never typed.
INTERNAL = re.compile(
    r"\b(max_ttl_us|ttl_us|hold_us|rotation_grace_us|expires_us|attempt_timeout|stagger|retry_interval|"
    r"dict_id|inbox_dir|file_window|request_timeout|max_file_size|\w+_us)\b"
)


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _verbs(sub, (*path, name))


VERBS = sorted(set(_verbs(build_parser())))


@dataclass(frozen=True)
class Case:
    """``iac ARGV`` must fail with one line naming the fix: every text of ``fix`` is in it."""

    argv: tuple[str, ...]
    fix: tuple[str, ...]
    #: the verb path the case covers (its first words, up to the verb's depth)
    verb: tuple[str, ...]


@dataclass
class Env:
    tmp: Path
    key: str
    other_id: str
    busy_port: int
    busy_udp_port: int


def _cases(e: Env) -> list[Case]:
    t = e.tmp
    key, bid = e.key, e.other_id
    target = ("--to", bid, "--addr", "tls://127.0.0.1:9")
    out: list[Case] = []

    def case(verb: str, argv: list[str], *fix: str) -> None:
        out.append(Case(tuple(argv), fix, tuple(verb.split())))

    # keygen, id
    case("keygen", ["keygen", "--out", str(t / "dir")], "is a directory", f"--out {t / 'dir' / 'agent.key'}")
    case("keygen", ["keygen", "--out", key], "already exists", "add --force")
    case("keygen", ["keygen"], "required: --out", "see `iac keygen --help`")
    case("id", ["id", "--key", str(t / "dir")], "is a directory", "iac keygen --out")
    case("id", ["id", "--key", str(t / "binary.key")], "not an IAC key file", "iac keygen --out FILE")
    case("id", ["id", "--key", str(t / "open.key")], "chmod 600")
    case("id", ["id", "--key", str(t / "missing.key")], "no such key file", "iac keygen --out")
    # dict train
    case("dict", ["dict", "nosuch"], "invalid choice", "choose from", "see `iac dict --help`")
    train = ["dict", "train", SAMPLES]
    case("dict train", [*train, "--out", str(t / "d1"), "--size", "-5"], "--size", "from 256 to 1048576")
    case(
        "dict train",
        [*train, "--out", "/nonexistent/x"],
        "/nonexistent does not exist",
        "mkdir -p /nonexistent",
    )
    case("dict train", [*train, "--out", str(t / "d2"), "--level", "99"], "--level", "from 1 to 22")
    case("dict train", [*train, "--out", str(t / "file")], "already exists", "add --force")
    case(
        "dict train",
        ["dict", "train", str(t / "nosamples.jsonl"), "--out", str(t / "d3")],
        "no such sample file",
    )
    # demo
    case("demo", ["demo", "--codec", "--count", "-1"], "--count", "from 1 to 1000000")
    case("demo", ["demo", "--count", "5"], "add --codec")
    # node
    node = ["node", "--key", key, "--listen", "tls://127.0.0.1:0"]
    case("node", [*node, "--inbox", str(t / "file")], "--inbox", "is a file, not a directory")
    reg = f"{bid}@tls://127.0.0.1:9"
    case("node", [*node, "--ttl", "-5", "--registry", reg], "--ttl", "more than 0")
    case("node", [*node, "--ttl", "1e12", "--registry", reg], "--ttl", "at most 31536000 (a year)")
    case("node", [*node, "--alias", "writer.team-a"], "add --registry")
    case("node", [*node, "--registry", f"{SMALL_ORDER}@tls://127.0.0.1:9"], AGENT_ID_TEXT)
    case("node", [*node, "--registry", "tls://127.0.0.1:9"], "give AGENT_ID@URL")
    case(
        "node", ["node", "--key", key, "--listen", f"unix://{t / 'open'}/n.sock"], "mode 0755", "mkdir -m 700"
    )
    case(
        "node",
        ["node", "--key", key, "--listen", f"tls://127.0.0.1:{e.busy_port}"],
        "the address is in use",
        "port 0 picks a free one",
    )
    # the same words on every transport
    case(
        "node",
        ["node", "--key", key, "--listen", f"quic://127.0.0.1:{e.busy_udp_port}"],
        "the address is in use",
        "choose another address or port",
    )
    case("node", ["node", "--key", key, "--listen", "bogus"], "not an address", "quic://HOST:PORT")
    case("node", [*node, "--metrics", "nope"], "--metrics", "give HOST:PORT")
    case("node", [*node, "--admin", str(t / "dir")], "--admin", "name the socket in it")
    # status
    case(
        "status", ["status", "--admin", str(t / "none.sock")], "no status socket there", "is the node running"
    )
    case("status", ["status", "--watch", "0"], "--watch", "more than 0")
    # conformance
    cf = ["conformance", "tls://127.0.0.1:9"]
    case("conformance", cf, "--to AGENT_ID is required", "--client")
    case("conformance", [*cf, "--to", SMALL_ORDER], "not an AgentId")
    case("conformance", ["conformance", "ftp://127.0.0.1:9", "--to", bid], "not a transport address")
    case("conformance", [*cf, "--to", bid, "--timeout", "-1"], "--timeout", "more than 0")
    case("conformance", [*cf, "--to", bid, "--case", "nosuch"], "--case nosuch", "no case has that id")
    # ping
    ping = ["ping", "--key", key, *target]
    case("ping", [*ping, "--timeout", "inf"], "--timeout", "finite number more than 0")
    case("ping", [*ping, "--timeout", "nan"], "--timeout", "finite number more than 0")
    case("ping", [*ping, "--timeout", "-1"], "--timeout", "more than 0")
    case("ping", [*ping, "--count", "0"], "--count", "from 1 to")
    case("ping", ["ping", "--key", key, "--to", SMALL_ORDER, "--addr", "tls://127.0.0.1:9"], AGENT_ID_TEXT)
    case("ping", [*ping, "--pin", "tls", "--forbid", "tls"], "drop one of them")
    case(
        "ping", ["ping", "--key", key, "--to", bid, "--addr", "http://x"], "not an address", "tls://HOST:PORT"
    )
    # certs
    case("certs", ["certs", "nosuch"], "invalid choice", "choose from")
    case("certs init", ["certs", "init", "--dir", str(t / "file")], "is a file, not a directory")
    case(
        "certs init",
        ["certs", "init", "--dir", str(t / "c1"), "--node", "../evil"],
        "path separator",
        "--node web1",
    )
    case("certs init", ["certs", "init", "--dir", str(t / "c2"), "--node", "ca"], "the CA's own file name")
    # send-file
    sf = ["send-file", "--key", key, *target]
    case("send-file", [*sf, str(t / "dir")], "is a directory", "pack a directory")
    case("send-file", [*sf, str(t / "missing.bin")], "no such file")
    case("send-file", [*sf, str(t / "file"), "--timeout", "0"], "--timeout", "more than 0")
    case(
        "send-file",
        ["send-file", "--key", key, "--to", "xyz", "--addr", "tls://127.0.0.1:9", str(t / "file")],
        AGENT_ID_TEXT,
    )
    # registry
    regv = ["registry", "--key", key, "--listen", "tls://127.0.0.1:0"]
    case("registry", [*regv, "--max-ttl", "-1", "--store", "memory"], "--max-ttl", "more than 0")
    case("registry", [*regv, "--grace", "nan", "--store", "memory"], "--grace", "finite number 0 or more")
    case("registry", [*regv, "--store", "bogus"], "not a registry store", "memory, sqlite:PATH")
    case("registry", [*regv, "--store", f"sqlite:{t / 'nodir' / 'r.db'}"], "mkdir -p")
    case(
        "registry", [*regv, "--store", "redis://127.0.0.1:6379", "NO_REDIS"], "pip install 'iac-mesh[redis]'"
    )
    # send, request, call
    case("send", ["send", "--key", key, *target, "--timeout", "inf"], "--timeout", "finite number")
    case("send", ["send", "--key", key, *target, "--type", "ACK"], "not a message type to send", "RUN")
    case("send", ["send", "--key", key, *target, "--payload", "{oops"], "not JSON", "quote it for the shell")
    case("send", ["send", "--key", key, "--to", bid], "add --addr URL")
    case("request", ["request", "--key", key, *target, "--type", "DELEGATE_TASK"], "add --task", '"task_id"')
    bad_intent = TASK.replace("ASSIGN_TASK", "NOPE")
    case("request", ["request", "--key", key, *target, "--task", bad_intent], "intent 'NOPE'", "ASSIGN_TASK")
    bad_step = TASK.replace('"step": 1', '"step": 3')
    case("request", ["request", "--key", key, *target, "--task", bad_step], "1 <= step <= steps")
    case(
        "request",
        ["request", "--key", key, "--to", SMALL_ORDER, "--addr", "tls://127.0.0.1:9"],
        AGENT_ID_TEXT,
    )
    case(
        "call",
        ["call", "--key", key, *target, "f", "--kwargs", "[1]"],
        "must be a JSON object",
        "--kwargs '{",
    )
    case(
        "call",
        ["call", "--key", key, "--to", "Not An Id!", "--addr", "tls://127.0.0.1:9", "f"],
        "nor an alias",
    )
    case("call", ["call", "--key", key, "--to", "writer.team-a", "f"], "add --registry ID@URL")
    # bench, proto
    case("bench", ["bench", "--only", "nosuch"], "--only nosuch", "choose from", "iac bench --list")
    case("proto", ["proto", "nosuch"], "invalid choice", "choose from")
    case("proto list", ["proto", "list", "--protoc", "/bin/false"], "not a protoc", "protobuf-compiler")
    case(
        "proto compile",
        ["proto", "compile", "--lang", "python", "--out", str(t / "file")],
        "is a file",
        "folder",
    )
    case("proto compile", ["proto", "compile", "--lang", "cobol", "--out", str(t / "gen")], "invalid choice")
    # a2a
    case("a2a", ["a2a", "nosuch"], "invalid choice", "choose from")
    gw = ["a2a", "gateway", "--key", key, "--listen", "http://127.0.0.1:0"]
    case("a2a gateway", [*gw, "--to", "xx", "--tokens", str(t / "file")], AGENT_ID_TEXT)
    case("a2a gateway", [*gw, "--to", bid, "--timeout", "inf"], "--timeout", "finite number")
    br = ["a2a", "bridge", "--key", key, "--listen", "tls://127.0.0.1:0"]
    case("a2a bridge", [*br, "--to", "ftp://x"], "http://HOST:PORT")
    case(
        "a2a bridge",
        [*br, "--to", "http://127.0.0.1:9", "--bearer-token-file", str(t / "none")],
        "write the token",
    )
    case("a2a card", ["a2a", "card", "--key", key, "--to", "xx"], AGENT_ID_TEXT)
    # mcp
    case("mcp", ["mcp", "nosuch"], "invalid choice", "choose from")
    sv = ["mcp", "serve", "--key", key, "--listen", "tls://127.0.0.1:0"]
    case("mcp serve", sv, "--stdio -- CMD ARGS")
    case("mcp serve", [*sv, "--calls-per-peer", "0", "--stdio", "--", "x"], "--calls-per-peer")
    case("mcp serve", [*sv, "--allow", "nope", "--stdio", "--", "x"], "AGENT=TOOL")
    case("mcp serve", [*sv, "--stdio", "--", str(t / "no-such-server")], "cannot start")
    case("mcp connect", ["mcp", "connect", "--key", key, "--to", "xx"], AGENT_ID_TEXT)
    return out


@dataclass
class Result:
    returncode: int
    stderr: str


def _run(argv: tuple[str, ...], env: dict[str, str], cwd: Path) -> Result:
    args = list(argv)
    if "NO_REDIS" in args:  # the Redis client is missing: a module named redis that cannot import
        args.remove("NO_REDIS")
        env = {**env, "PYTHONPATH": os.pathsep.join([str(cwd / "fake"), env.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )
    return Result(proc.returncode, proc.stderr)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Case], dict[Case, Result]]]:
    tmp = tmp_path_factory.mktemp("cli-errors")
    key = tmp / "a.key"
    Identity.generate().save(key)
    other = Identity.generate()
    (tmp / "dir").mkdir()
    (tmp / "file").write_text("x")
    (tmp / "binary.key").write_bytes(bytes(range(256)))
    (tmp / "binary.key").chmod(0o600)
    Identity.generate().save(tmp / "open.key")
    (tmp / "open.key").chmod(0o644)
    (tmp / "open").mkdir(mode=0o755)
    (tmp / "open").chmod(0o755)
    (tmp / "fake" / "redis").mkdir(parents=True)
    (tmp / "fake" / "redis" / "__init__.py").write_text("raise ImportError('no redis client here')\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy_udp.bind(("127.0.0.1", 0))
    env = {k: v for k, v in os.environ.items() if k not in ("SSLKEYLOGFILE", "PYTHONWARNINGS")}
    env["XDG_RUNTIME_DIR"] = str(tmp / "dir")
    e = Env(tmp, str(key), other.agent_id, busy.getsockname()[1], busy_udp.getsockname()[1])
    cases = _cases(e)
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = dict(zip(cases, pool.map(lambda c: _run(c.argv, env, tmp), cases), strict=True))
        yield cases, results
    finally:
        busy.close()
        busy_udp.close()


def test_every_verb_has_a_bad_argument_case(ran: tuple[list[Case], dict[Case, Result]]) -> None:
    cases, _ = ran
    covered = {c.verb for c in cases}
    assert set(VERBS) - covered == set(), "verbs without a bad-argument case"


def _check(case: Case, result: Result) -> None:
    where = f"iac {' '.join(case.argv)}"
    assert result.returncode != 0, where
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, (where, result.stderr)
    line = result.stderr.rstrip("\n")
    assert line.startswith(f"iac {' '.join(case.verb)}: error: "), (where, line)
    for text in case.fix:
        assert text in line, (where, text, line)
    assert CLASS_NAME.search(line) is None, (where, line)
    assert INTERNAL.search(line) is None, (where, line)
    assert "Traceback" not in line and "GPL" not in line, (where, line)


def test_each_bad_argument_is_one_line_naming_the_fix(ran: tuple[list[Case], dict[Case, Result]]) -> None:
    cases, results = ran
    failures = []
    for case in cases:
        try:
            _check(case, results[case])
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)


def test_no_two_cases_print_the_same_line(ran: tuple[list[Case], dict[Case, Result]]) -> None:
    """Each case gets its own message (a catch-all that prints one text for all would not)."""
    cases, results = ran
    by_line: dict[str, list[tuple[str, ...]]] = {}
    for case in cases:
        by_line.setdefault(results[case].stderr, []).append(case.argv)
    assert all(len(v) == 1 for v in by_line.values()), [v for v in by_line.values() if len(v) > 1]
