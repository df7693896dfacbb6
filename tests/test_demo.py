"""``make demo`` (``python -m iac demo``): the 5-process mesh on loopback, failures, the codec demo."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from iac.demo import codec as _codec
from iac.demo import driver as _demo
from iac.demo import http as _http

ROLES = ("registry", "planner", "researcher", "writer", "checker")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a reused pid that belongs to someone else
        return True
    return True


def test_demo_runs_the_mesh_and_prints_the_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "iac", "demo"], capture_output=True, text=True, timeout=90
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for part in (
        "capability lookup",
        "planner → registry",
        "remote call sources()",
        "step 1/4 ASSIGN_TASK",
        "step 2/4 PROVIDE_INFO",
        "step 3/4 ASSIGN_TASK",
        "step 4/4 FINAL_RESULT",
        "checker → writer → planner",  # step 4/4 goes back through the relay
        "relayed request",
        "planner → writer → checker",
        'broadcast "task done"',
        "file draft-",
        "SHA-256",
        "HTTP+JSON",
        "each handler got it once",
    ):
        assert part in text, f"{part!r} missing from:\n{text}"
    lines = [line for line in text.splitlines() if line.startswith("  ") and len(line.split()) > 2]
    rows = {" ".join(line.split()[:2]): line for line in lines}
    for transport in ("quic", "tls", "unix"):
        assert re.search(rf"\s{transport}(\s|→|\+)", text), f"no {transport} row in:\n{text}"
    assert "unix→tls" in rows["step 4/4"] and "tls→unix" in rows["relayed request"]
    # Nine rows, each with a latency and a byte count that is smaller than HTTP+JSON's.
    table = [re.match(r"\s{2}(\S.{27}) .{30} \S+\s+([\d.]+)\s+(\d+)\s+(\d+)\s+\d+%$", x) for x in lines]
    found = [m for m in table if m is not None and m.group(1).strip() != "total"]
    assert len(found) == 9, text
    for m in found:
        assert float(m.group(2)) >= 0 and 0 < int(m.group(3)) < int(m.group(4)), m.group(0)
    # The child processes are gone and the temporary directory too.
    pids = dict(re.findall(r"(\w+)=(\d+)", next(x for x in text.splitlines() if x.startswith("processes:"))))
    assert set(pids) == set(ROLES)
    assert not [role for role, pid in pids.items() if _alive(int(pid))]
    workdir = re.search(r"SQLite registry (\S+)registry\.db", text)
    assert workdir is not None and not Path(workdir.group(1)).exists()


FAKE_AGENT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    role, workdir = sys.argv[1], sys.argv[3]
    (open(os.path.join(workdir, role + ".pid"), "w")).write(str(os.getpid()))
    mode = os.environ["FAKE_MODE"]
    def say(**ev):
        print(json.dumps(ev), flush=True)
    if role == "registry":
        if mode == "timeout":
            time.sleep(60)  # never ready
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignores stdin and SIGTERM: needs SIGKILL
        say(event="ready", role=role, pid=os.getpid(), agent_id="ab" * 32, addresses=["tls://127.0.0.1:1"])
        time.sleep(60)
    if role == "checker":
        say(event="error", role=role, message="DemoError: the draft did not verify")
        sys.exit(1)
    sys.stdin.read()  # the others stop when stdin closes
    """
)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("error", "checker: DemoError: the draft did not verify"),
     ("timeout", "timed out after 2 s waiting for the registry to start")],
)  # fmt: skip
def test_a_failure_is_one_line_and_every_child_is_stopped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mode: str,
    expected: str,
) -> None:
    (tmp_path / "fake_demo_agent.py").write_text(FAKE_AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_MODE", mode)
    monkeypatch.setattr(_demo, "STOP_GRACE", 0.5)
    workdir = tmp_path / "run"
    workdir.mkdir()
    rc = asyncio.run(_demo.run_mesh(workdir, module="fake_demo_agent", timeout=2.0))
    assert rc == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("iac demo: failed: ") and expected in err, err
    pids = [int(p.read_text()) for p in workdir.glob("*.pid")]
    assert pids and not [pid for pid in pids if _alive(pid)]


def test_codec_demo_on_the_corpus_and_without_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _demo.run_demo(argparse.Namespace(codec=True, count=40)) == 0
    out = capsys.readouterr().out
    assert "signatures verified: 40/40" in out and "MessageRejected (bad_signature)" in out
    monkeypatch.setattr(_codec, "find_corpus", lambda: None)
    assert _codec.run_codec_demo(argparse.Namespace(count=30)) == 0
    assert "built-in samples" in capsys.readouterr().out


def test_http_json_envelope_sizes() -> None:
    a, b = "a" * 64, "b" * 64
    body = _http.http_body(a, b, "RUN", '{"x":1}', timestamp_us=1, msg_id=2, session_id=3)
    assert body.startswith(b'{"from":"' + a.encode()) and b'"payload":{"x":1},' in body
    post = _http.http_post(body)
    assert post.startswith(b"POST /iac/v1/messages HTTP/1.1\r\n") and post.endswith(b"\r\n\r\n" + body)
    assert f"Content-Length: {len(body)}\r\n".encode() in post
    assert _http.http_response(None) == b"HTTP/1.1 204 No Content\r\n\r\n"
    assert _http.http_file_bytes(a, b, "f.md", b"x" * 3000) > 4000  # base64 in JSON
