"""Logging: the logger tree by layer, the extra fields, the text and JSON formats, the levels of
-v/-vv/-vvv, and a node process logging JSON lines."""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iac.cli import logs
from iac.cli.main import build_parser
from iac.wire.identity import Identity

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _layer_logger(path: Path) -> str:
    """The logger a module of ``iac/`` must use: its layer's (``iac.transport.quic`` for QUIC)."""
    parts = path.relative_to(ROOT / "iac").parts
    if parts[:2] == ("transport", "quic"):
        return "iac.transport.quic"
    return f"iac.{parts[0]}"


def _loggers_named(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("iac")
        ):
            yield node.args[0].value


def test_every_module_logs_under_its_layer() -> None:
    found = {}
    for path in sorted((ROOT / "iac").rglob("*.py")):
        for name in _loggers_named(path):
            found[str(path.relative_to(ROOT))] = name
            if path.parts[-2] == "cli" and path.name == "logs.py":
                continue  # sets the levels of the tree
            assert name == _layer_logger(path), f"{path.relative_to(ROOT)} logs as {name}"
    assert {"iac.node", "iac.transport", "iac.transport.quic", "iac.mesh", "iac.integrations"} <= set(
        found.values()
    )
    for name in found.values():
        assert name == "iac" or name in logs.LOGGERS, name


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.getLogger("iac").level, logging.getLogger("quic").level)
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in saved[1]:
                root.removeHandler(h)
        root.setLevel(saved[0])
        logging.getLogger("iac").setLevel(saved[2])
        logging.getLogger("quic").setLevel(saved[3])


FIELDS = {
    "peer": "3f1c2a4b5c6d7e8f",
    "transport": "quic",
    "msg_type": "RUN",
    "msg_id": 7,
    "reason": "replayed",
}


def test_json_lines_carry_the_fields(restore_logging: None) -> None:
    out = io.StringIO()
    logs.setup_logging(1, "json", out)
    log = logging.getLogger("iac.node")
    log.info("refused %s from %s…", "replayed", "3f1c2a4b5c6d7e8f", extra=FIELDS)
    log.debug("not shown at -v")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("handler for %s failed", "RUN", extra={"msg_type": "RUN", "peer": "ab" * 8})
    logging.getLogger("iac.transport.quic").warning("closing", extra={"code": "BUFFER_EXCEEDED"})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    first = records[0]
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert first["time"].endswith("Z") and first["level"] == "INFO" and first["logger"] == "iac.node"
    assert first["message"] == "refused replayed from 3f1c2a4b5c6d7e8f…"
    assert {k: first[k] for k in FIELDS} == FIELDS
    assert records[1]["level"] == "ERROR" and "ValueError: boom" in records[1]["exception"]
    assert records[1]["msg_type"] == "RUN"
    assert records[2] == {**records[2], "logger": "iac.transport.quic", "code": "BUFFER_EXCEEDED"}


def test_text_lines_show_the_fields_in_brackets(restore_logging: None) -> None:
    out = io.StringIO()
    logs.setup_logging(2, "text", out)
    logging.getLogger("iac.node").debug("refused", extra=FIELDS)
    line = out.getvalue().rstrip("\n")
    fields = "peer=3f1c2a4b5c6d7e8f transport=quic msg_type=RUN msg_id=7 reason=replayed"
    assert f" DEBUG iac.node: refused [{fields}]" in line


@pytest.mark.parametrize(
    ("verbose", "iac_level", "quic_level"),
    [
        (0, logging.WARNING, logging.WARNING),
        (1, logging.INFO, logging.WARNING),
        (2, logging.DEBUG, logging.INFO),
        (3, logging.DEBUG, logging.DEBUG),
    ],
)
def test_levels(restore_logging: None, verbose: int, iac_level: int, quic_level: int) -> None:
    logs.setup_logging(verbose, "text", io.StringIO())
    assert logging.getLogger("iac").level == iac_level
    assert logging.getLogger("quic").level == quic_level
    assert logs.levels(verbose) == (iac_level, quic_level)


def test_setting_up_again_replaces_the_handler(restore_logging: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.setup_logging(1, "text", first)
    logs.setup_logging(1, "json", second)
    logging.getLogger("iac.mesh").warning("once")
    assert first.getvalue() == "" and json.loads(second.getvalue())["message"] == "once"


def test_the_long_running_verbs_take_the_logging_options() -> None:
    parser = build_parser()
    for argv in (
        ["node", "--key", "k", "--listen", "tls://127.0.0.1:0"],
        ["registry", "--key", "k", "--listen", "tls://127.0.0.1:0"],
        ["a2a", "gateway", "--key", "k", "--listen", "http://127.0.0.1:0", "--to", "x"],
        ["a2a", "bridge", "--key", "k", "--listen", "tls://127.0.0.1:0", "--to", "http://x"],
    ):
        args = parser.parse_args([*argv, "-vv", "--log-format", "json"])
        assert (args.verbose, args.log_format) == (2, "json"), argv


def test_a_node_process_logs_json_lines(tmp_path: Path) -> None:
    """`iac node -vv --log-format json`: every stderr line is one JSON object; a peer coming up
    and going down is logged with its fields."""
    key, other = tmp_path / "n.key", tmp_path / "c.key"
    ident = Identity.generate()
    ident.save(key)
    Identity.generate().save(other)
    env = {**ENV, "XDG_RUNTIME_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "iac", "node", "--key", str(key), "--listen", "tls://127.0.0.1:0"]
    node = subprocess.Popen(
        [*cmd, "-vv", "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert node.stdout is not None
        assert node.stdout.readline().split()[0] == "node"
        addr = node.stdout.readline().split()[1]
        out = subprocess.run(
            [sys.executable, "-m", "iac", "request", "--key", str(other), "--to", ident.agent_id,
             "--addr", addr],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1 and "no_handler" in out.stderr
    finally:
        node.send_signal(signal.SIGTERM)
        _, err = node.communicate(timeout=30)
    records = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    assert records
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r)
    peers = [r for r in records if r["logger"] == "iac.node" and r["message"].startswith("peer ")]
    assert [r["message"].split()[2] for r in peers] == ["up", "down"]
    assert all(r["transport"] == "tls" and len(r["peer"]) == 16 for r in peers)
