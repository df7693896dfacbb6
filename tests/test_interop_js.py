"""The Node.js second implementation (tests/interop/js/verify.mjs) against the vectors, both ways.

The JS verifier shares no code with this library: it parses frames, excises the
signature field, decompresses with the `zstd` command line and verifies with Node's
crypto. It must pass every vector and refuse every negative one for the stated
reason; the frame it makes must be accepted here. CI installs node, npm and zstd
(.ci/run), so a missing tool fails the test instead of skipping it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import iac
from iac import Identity
from iac.wire import Dictionary, DictionarySet, Domain
from iac.wire.scan import excise_signature

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "interop" / "js"
VECTOR_DIR = ROOT / "proto" / "testvectors"
DOC: dict[str, Any] = json.loads((VECTOR_DIR / "v1.json").read_text(encoding="utf-8"))
DICTS = DictionarySet(Dictionary.load(VECTOR_DIR / name) for name in DOC["dictionaries"].values())


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required by the interop test: install {package} (.ci/run does)")
    return path


@pytest.fixture(scope="module")
def node() -> str:
    node = _tool("node", "Node.js >= 20")
    _tool("zstd", "Debian package zstd")
    if not (JS_DIR / "node_modules" / "@bufbuild" / "protobuf").is_dir():
        npm = _tool("npm", "npm")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True, timeout=600)
    return node


def _verify(node: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    run = subprocess.run(
        [node, "verify.mjs", *args], cwd=JS_DIR, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert lines, f"no summary from verify.mjs:\n{run.stdout}\n{run.stderr}"
    return run, json.loads(lines[-1].removeprefix("SUMMARY "))


def test_js_verifier_passes_every_vector_and_python_accepts_its_frame(node, tmp_path):
    emit = tmp_path / "js_frame.json"
    run, summary = _verify(node, "--emit", str(emit))
    assert run.returncode == 0, run.stdout + run.stderr
    assert summary["failed"] == 0 and summary["failures"] == []
    for kind in ("vectors", "accept", "hello", "hello_negative", "negative"):
        assert summary[kind] == len(DOC[kind]), kind
    for v in DOC["negative"]:
        assert f"ok   negative {v['name']} ({v['error']}" in run.stdout
    for v in DOC["hello_negative"]:
        assert f"ok   hello_negative {v['name']} ({v['error']})" in run.stdout
    # OpenSSL alone accepts these signatures: the verifier's own AgentId check refuses them
    for name in ("small_order_key", "small_order_key_order_8", "identity_key_sign_bit", "mixed_order_key"):
        assert f"ok   negative {name} (invalid_agent_id; plain OpenSSL verify says true)" in run.stdout
    # and this one with a valid key: only the R rule (section 2) refuses it
    assert "ok   negative small_order_r (bad_signature; plain OpenSSL verify says true)" in run.stdout

    made = json.loads(emit.read_text(encoding="utf-8"))
    data = bytes.fromhex(made["frame_hex"])
    frame = iac.wire.decode_frame(data, dictionaries=DICTS)
    assert data[1] == 0x01 and frame.dict_id == made["dict_id"] in DICTS  # zstd with the dictionary
    assert len(data) < len(frame.body)  # it did compress
    msg = iac.wire.decode_message_frame(data, dictionaries=DICTS)
    m = made["message"]
    # the same seed gives the same key and, Ed25519 being deterministic, the same signature
    ident = Identity.from_seed(bytes.fromhex(made["seed_hex"]))
    assert iac.wire.sender_of(msg) == ident.agent_id == made["agent_id"] == m["from"]
    unsigned, sig = excise_signature(frame.body)
    assert unsigned.hex() == made["unsigned_hex"] and frame.body.hex() == made["signed_hex"]
    assert ident.sign(Domain.MESSAGE, unsigned) == sig == msg.signature
    assert iac.wire.unsigned_bytes(msg) == unsigned  # protobuf-es and this library serialize alike
    assert msg.to == m["to"] and msg.msg_type == m["msg_type"] and msg.payload_json == m["payload_json"]
    assert (msg.timestamp, msg.msg_id, msg.session_id, msg.deadline) == (
        int(m["timestamp"]),
        int(m["msg_id"]),
        int(m["session_id"]),
        int(m["deadline"]),
    )
    assert msg.extra_data.hex() == m["extra_data_hex"] and msg.flags == m["flags"]
    t = m["task"]
    assert (msg.task.task_id, msg.task.intent, msg.task.step, msg.task.steps, msg.task.state_ref) == (
        t["task_id"],
        t["intent"],
        t["step"],
        t["steps"],
        t["state_ref"],
    )


def test_js_verifier_is_not_vacuous(node, tmp_path):
    """Wrong expectations in a copy of the vectors make the verifier fail, naming each one."""
    shutil.copytree(VECTOR_DIR, tmp_path / "tv")
    doc = json.loads((tmp_path / "tv" / "v1.json").read_text(encoding="utf-8"))
    sig = bytearray.fromhex(doc["vectors"][0]["signature_hex"])
    sig[0] ^= 1
    doc["vectors"][0]["signature_hex"] = sig.hex()
    by_name = {v["name"]: v for v in doc["negative"]}
    by_name["signature_twice"]["error"] = "signature_invalid"
    by_name["zstd_bomb"]["error"] = "frame_too_large"
    by_name["small_order_key"]["error"] = "bad_signature"
    by_name["mixed_order_key"]["error"] = "bad_signature"
    doc["negative"].append(
        {"name": "not_negative", "frame_hex": doc["vectors"][1]["frame_raw_hex"], "max_frame_size": 4194304,
         "error": "bad_signature"}
    )  # fmt: skip
    (tmp_path / "tv" / "v1.json").write_text(json.dumps(doc), encoding="utf-8")
    run, summary = _verify(node, "--vectors", str(tmp_path / "tv"))
    assert run.returncode == 1
    assert sorted(summary["failures"]) == [
        "negative mixed_order_key",
        "negative not_negative",
        "negative signature_twice",
        "negative small_order_key",
        "negative zstd_bomb",
        "vectors ping_minimal",
    ]
