"""proto/testvectors/v1.json: every vector re-derived and checked, and the file is reproducible.

The vectors are the contract with other implementations, so this file re-derives
each one from its inputs (seed, message fields) with the library's public API
instead of trusting the generator, and checks that every negative vector fails
with exactly the error name it states.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import nacl.bindings
import nacl.exceptions
import pytest

import iac
from iac import Identity, TaskState
from iac.errors import REASONS
from iac.wire import Dictionary, DictionarySet, Domain, FrameType, Session
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.identity import signing_input
from iac.wire.scan import HELLO_SCHEMA, MESSAGE_SCHEMA, excise_signature
from tools.vectors import points
from tools.vectors.wire import common as wire_vectors

ROOT = Path(__file__).resolve().parent.parent
VECTOR_DIR = ROOT / "proto" / "testvectors"
DOC: dict[str, Any] = json.loads((VECTOR_DIR / "v1.json").read_text(encoding="utf-8"))
DICTS = DictionarySet(Dictionary.load(VECTOR_DIR / name) for name in DOC["dictionaries"].values())
ERROR_NAMES = set(REASONS)


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in items]


def _rebuild(m: dict[str, Any]) -> iac.wire.Message:
    task = None
    if "task" in m:
        t = m["task"]
        task = TaskState(
            task_id=t["task_id"],
            intent=t["intent"],
            step=t["step"],
            steps=t["steps"],
            state_ref=t["state_ref"],
        )
    msg = iac.wire.build_message(
        sender=m["from"],
        to=m["to"],
        msg_type=m["msg_type"],
        session=Session(session_id=m["session_id"]),
        msg_id=m["msg_id"],
        timestamp_us=m["timestamp"],
        payload_json=m["payload_json"],
        extra_data=bytes.fromhex(m["extra_data_hex"]),
        reply_to=m["reply_to"],
        reply_session_id=m["reply_session_id"],
        flags=m["flags"],
        sealed=bytes.fromhex(m["sealed_hex"]),
        deadline_us=m["deadline"],
        task=task,
    )
    if "trace" in m:
        msg.trace.traceparent = m["trace"]["traceparent"]
        msg.trace.tracestate = m["trace"]["tracestate"]
    msg.stream_seq, msg.credit, msg.principal = m["stream_seq"], m["credit"], m["principal"]
    return msg


def _check_fields(msg: iac.wire.Message, m: dict[str, Any]) -> None:
    assert iac.wire.sender_of(msg) == m["from"]
    assert msg.to == m["to"]
    assert msg.msg_type == m["msg_type"]
    assert msg.payload_json == m["payload_json"]
    assert (msg.timestamp, msg.msg_id, msg.session_id) == (m["timestamp"], m["msg_id"], m["session_id"])
    assert msg.extra_data.hex() == m["extra_data_hex"]
    assert (msg.reply_to, msg.reply_session_id) == (m["reply_to"], m["reply_session_id"])
    assert (msg.flags, msg.deadline, msg.sealed.hex()) == (m["flags"], m["deadline"], m["sealed_hex"])
    assert (msg.stream_seq, msg.credit, msg.principal) == (m["stream_seq"], m["credit"], m["principal"])
    assert msg.HasField("trace") == ("trace" in m)
    if "trace" in m:
        assert (msg.trace.traceparent, msg.trace.tracestate) == (
            m["trace"]["traceparent"],
            m["trace"]["tracestate"],
        )
    assert msg.HasField("task") == ("task" in m)
    if "task" in m:
        t = m["task"]
        assert (msg.task.task_id, msg.task.intent, msg.task.step, msg.task.steps, msg.task.state_ref) == (
            t["task_id"],
            t["intent"],
            t["step"],
            t["steps"],
            t["state_ref"],
        )


# --- the file itself ------------------------------------------------------------------------


def test_file_has_the_spec_shape():
    assert DOC["version"] == 1
    assert set(DOC) >= {"version", "dictionaries", "vectors", "negative"}
    for dict_id, name in DOC["dictionaries"].items():
        d = DICTS.get(int(dict_id))
        assert d is not None and (VECTOR_DIR / name).is_file()
    spec_keys = {
        "name", "seed_hex", "agent_id", "message", "unsigned_hex", "signature_hex", "signed_hex",
        "frame_raw_hex", "frame_zstd_hex", "dict_id",
    }  # fmt: skip
    message_keys = {
        "from", "to", "msg_type", "payload_json", "timestamp", "msg_id", "session_id", "extra_data_hex",
        "reply_to",
    }  # fmt: skip
    for v in DOC["vectors"]:
        assert set(v) >= spec_keys
        assert set(v["message"]) >= message_keys
    for v in DOC["negative"]:
        assert set(v) >= {"name", "frame_hex", "max_frame_size", "error"}
    names = _ids(DOC["vectors"]) + _ids(DOC["negative"]) + _ids(DOC["accept"]) + _ids(DOC["hello"])
    assert len(names) == len(set(names)), "vector names are unique"


def test_vectors_cover_what_the_spec_lists():
    msg_types = {v["message"]["msg_type"] for v in DOC["vectors"]}
    assert iac.MessageType.DELEGATE_TASK in msg_types
    assert any("task" in v["message"] for v in DOC["vectors"])
    assert any(v["message"]["to"] == "" for v in DOC["vectors"]), "a broadcast"
    assert any(v["message"]["extra_data_hex"] for v in DOC["vectors"])
    assert any(v["message"]["reply_to"] and v["message"]["reply_session_id"] for v in DOC["vectors"])
    assert any(v["message"]["flags"] and v["message"]["deadline"] for v in DOC["vectors"])
    assert any(not v["message"]["payload_json"].isascii() for v in DOC["vectors"])
    # fields 16-19 and the STREAM/END bits, type 14 (sections 3, 11, 18)
    assert any("trace" in v["message"] for v in DOC["vectors"])
    for key in ("stream_seq", "credit", "principal"):
        assert any(v["message"][key] for v in DOC["vectors"]), key
    assert any(
        v["message"]["flags"] == iac.wire.message.FLAG_STREAM | iac.wire.message.FLAG_END
        for v in DOC["vectors"]
    )
    assert iac.MessageType.CREDIT in msg_types
    negatives = set(_ids(DOC["negative"]))
    for n in ("trace", "traceparent", "stream_seq", "credit", "principal"):
        assert f"{n}_repeated" in negatives, n
    errors = {v["error"] for v in DOC["negative"]}
    assert errors >= {
        "bad_signature", "signature_missing", "signature_repeated", "signature_invalid", "field_repeated",
        "invalid_agent_id", "unknown_frame_type", "unknown_frame_flag", "frame_too_large", "truncated_frame",
        "missing_content_size", "decompression_bomb", "trailing_data", "unknown_dictionary",
    }  # fmt: skip
    names = set(_ids(DOC["negative"]))
    assert {"agent_id_uppercase", "agent_id_short", "signature_short", "truncated_varint"} <= names


def test_keys_that_are_not_agent_ids_are_refused_before_their_signature():
    """Each key vector is refused as `from`; the small-order and mixed-order ones carry signatures that
    a signature check alone accepts (plain RFC 8032, or libsodium for the mixed-order key)."""
    by_name = {v["name"]: v for v in DOC["negative"] + DOC["hello_negative"]}
    for name in (
        "small_order_key",
        "small_order_key_order_8",
        "identity_key_sign_bit",
        "non_canonical_key",
        "mixed_order_key",
        "hello_small_order_key",
    ):
        assert by_name[name]["error"] == "invalid_agent_id", name
    for name, schema, domain in (
        ("small_order_key", MESSAGE_SCHEMA, Domain.MESSAGE),
        ("small_order_key_order_8", MESSAGE_SCHEMA, Domain.MESSAGE),
        ("mixed_order_key", MESSAGE_SCHEMA, Domain.MESSAGE),
        ("hello_small_order_key", HELLO_SCHEMA, Domain.HELLO_CLIENT),
    ):
        body = iac.wire.decode_frame(bytes.fromhex(by_name[name]["frame_hex"])).body
        unsigned, sig = excise_signature(body, schema)
        parsed = (
            Hello.FromString(body).agent_id
            if schema is HELLO_SCHEMA
            else iac.wire.sender_of(iac.wire.Message.FromString(body))
        )
        key = bytes.fromhex(parsed)
        assert points.plain_verify(key, signing_input(domain, unsigned), sig), name
    mixed = iac.wire.decode_frame(bytes.fromhex(by_name["mixed_order_key"]["frame_hex"])).body
    unsigned, sig = excise_signature(mixed)
    sender = iac.wire.sender_of(iac.wire.Message.FromString(mixed))
    assert sender == points.mixed_order(wire_vectors.ALICE.agent_id)
    nacl.bindings.crypto_sign_open(sig + signing_input(Domain.MESSAGE, unsigned), bytes.fromhex(sender))


def test_small_order_r_is_refused_by_the_r_rule_alone():
    """Alice's valid key, R the identity: the plain check accepts it, libsodium's R rule (section 2,
    the seven encodings compared with bit 255 cleared) refuses it, and so for R with bit 255 set."""
    by_name = {v["name"]: v for v in DOC["negative"]}
    key = bytes.fromhex(wire_vectors.ALICE.agent_id)
    for name, plain in (("small_order_r", True), ("small_order_r_sign_bit", False)):
        assert by_name[name]["error"] == "bad_signature"
        body = iac.wire.decode_frame(bytes.fromhex(by_name[name]["frame_hex"])).body
        unsigned, sig = excise_signature(body)
        assert iac.wire.sender_of(iac.wire.Message.FromString(body)) == wire_vectors.ALICE.agent_id
        assert bytes([sig[0]]) + sig[1:31] + bytes([sig[31] & 0x7F]) == points.encode(points.IDENTITY)
        assert points.plain_verify(key, signing_input(Domain.MESSAGE, unsigned), sig) is plain, name
        with pytest.raises(nacl.exceptions.BadSignatureError):
            nacl.bindings.crypto_sign_open(sig + signing_input(Domain.MESSAGE, unsigned), key)


@pytest.mark.parametrize(
    "v", DOC["negative"] + DOC["hello_negative"], ids=_ids(DOC["negative"] + DOC["hello_negative"])
)
def test_error_names_are_documented_error_classes(v):
    assert v["error"] in ERROR_NAMES


# --- positive vectors -----------------------------------------------------------------------


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_agent_id_from_seed(v):
    ident = Identity.from_seed(bytes.fromhex(v["seed_hex"]))
    assert ident.agent_id == v["agent_id"] == v["message"]["from"]


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_unsigned_bytes_rebuilt_from_fields(v):
    assert iac.wire.unsigned_bytes(_rebuild(v["message"])).hex() == v["unsigned_hex"]


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_signature_and_signed_bytes(v):
    ident = Identity.from_seed(bytes.fromhex(v["seed_hex"]))
    unsigned = bytes.fromhex(v["unsigned_hex"])
    sig = ident.sign(Domain.MESSAGE, unsigned)  # Ed25519 is deterministic
    assert sig.hex() == v["signature_hex"]
    iac.wire.verify(v["agent_id"], Domain.MESSAGE, unsigned, sig)
    msg = _rebuild(v["message"])
    assert iac.wire.sign_message(ident, msg).hex() == v["signed_hex"]
    assert excise_signature(bytes.fromhex(v["signed_hex"])) == (unsigned, sig)


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_raw_frame(v):
    data = bytes.fromhex(v["frame_raw_hex"])
    frame = iac.wire.decode_frame(data)
    assert frame.type == FrameType.MESSAGE and frame.dict_id is None
    assert frame.body.hex() == v["signed_hex"]
    assert iac.wire.encode_frame(FrameType.MESSAGE, frame.body) == data
    _check_fields(iac.wire.decode_message_frame(data), v["message"])


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_zstd_frame_decodes_with_the_dictionary(v):
    data = bytes.fromhex(v["frame_zstd_hex"])
    assert data[0] == FrameType.MESSAGE and data[1] == 0x01
    frame = iac.wire.decode_frame(data, dictionaries=DICTS)
    assert frame.dict_id == v["dict_id"]
    assert frame.body.hex() == v["signed_hex"]
    _check_fields(iac.wire.decode_message_frame(data, dictionaries=DICTS), v["message"])
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        iac.wire.decode_frame(data)
    assert exc_info.value.reason == "unknown_dictionary"


@pytest.mark.parametrize("v", DOC["accept"], ids=_ids(DOC["accept"]))
def test_accept_vectors(v):
    data = bytes.fromhex(v["frame_hex"])
    frame = iac.wire.decode_frame(data, dictionaries=DICTS, max_frame_size=v["max_frame_size"])
    assert frame.body.hex() == v["signed_hex"]
    unsigned, sig = excise_signature(frame.body)
    assert unsigned.hex() == v["unsigned_hex"]
    iac.wire.verify(v["agent_id"], Domain.MESSAGE, unsigned, sig)
    msg = iac.wire.decode_message_frame(data, dictionaries=DICTS, max_frame_size=v["max_frame_size"])
    assert iac.wire.sender_of(msg) == v["agent_id"]


# --- HELLO ----------------------------------------------------------------------------------


@pytest.mark.parametrize("v", DOC["hello"], ids=_ids(DOC["hello"]))
def test_hello_vectors(v):
    ident = Identity.from_seed(bytes.fromhex(v["seed_hex"]))
    assert ident.agent_id == v["agent_id"] == v["hello"]["agent_id"]
    domain = Domain(v["domain"].encode())
    h = v["hello"]
    hello = Hello(
        version=h["version"],
        agent_id=h["agent_id"],
        session_id=h["session_id"],
        timestamp=h["timestamp"],
        nonce=bytes.fromhex(h["nonce_hex"]),
        peer_nonce=bytes.fromhex(h["peer_nonce_hex"]),
        dict_ids=h["dict_ids"],
        max_frame_size=h["max_frame_size"],
        listen_addrs=h["listen_addrs"],
        capabilities=h["capabilities"],
        channel_binding=bytes.fromhex(h["channel_binding_hex"]),
        peer_agent_id=h["peer_agent_id"],
    )
    assert hello.SerializeToString(deterministic=True).hex() == v["unsigned_hex"]
    assert iac.wire.sign_hello(ident, hello, domain).hex() == v["signed_hex"]
    assert hello.signature.hex() == v["signature_hex"]
    signed = bytes.fromhex(v["signed_hex"])
    assert excise_signature(signed, HELLO_SCHEMA) == (bytes.fromhex(v["unsigned_hex"]), hello.signature)
    frame = iac.wire.decode_frame(bytes.fromhex(v["frame_raw_hex"]))
    assert frame.type == FrameType.HELLO and frame.body == signed
    assert iac.wire.open_hello(frame.body, domain).agent_id == v["agent_id"]
    other = Domain.HELLO_SERVER if domain is Domain.HELLO_CLIENT else Domain.HELLO_CLIENT
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.open_hello(signed, other)
    assert exc_info.value.reason == "bad_signature"


@pytest.mark.parametrize("v", DOC["hello_negative"], ids=_ids(DOC["hello_negative"]))
def test_hello_negative(v):
    frame = iac.wire.decode_frame(bytes.fromhex(v["frame_hex"]))
    with pytest.raises(iac.IacError) as info:
        iac.wire.open_hello(frame.body, Domain(v["domain"].encode()))
    assert info.value.reason == v["error"]


# --- negative vectors -----------------------------------------------------------------------


@pytest.mark.parametrize("v", DOC["negative"], ids=_ids(DOC["negative"]))
def test_negative_vector_raises_the_named_error(v):
    data = bytes.fromhex(v["frame_hex"])
    with pytest.raises(iac.IacError) as info:
        iac.wire.decode_message_frame(data, dictionaries=DICTS, max_frame_size=v["max_frame_size"])
    assert info.value.reason == v["error"], str(info.value)


@pytest.mark.parametrize("v", DOC["negative"], ids=_ids(DOC["negative"]))
def test_negative_vector_fed_byte_by_byte(v):
    """The streaming decoder (TCP, UNIX sockets) refuses each vector for the same reason."""
    data = bytes.fromhex(v["frame_hex"])
    dec = iac.wire.FrameDecoder(dictionaries=DICTS, max_frame_size=v["max_frame_size"])
    with pytest.raises(iac.IacError) as info:
        frames: list[iac.wire.Frame] = []
        for i in range(len(data)):
            frames += dec.feed(data[i : i + 1], final=i == len(data) - 1)
        assert len(frames) == 1
        iac.wire.open_message(frames[0].body)
    assert info.value.reason == v["error"], str(info.value)


# --- reproducibility ------------------------------------------------------------------------


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_testvectors", ROOT / "tools" / "make_testvectors.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _zstd_frames(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, frame hex, signed hex) of every compressor-made frame in ``doc``."""
    out = [("vector:" + v["name"], v["frame_zstd_hex"], v["signed_hex"]) for v in doc["vectors"]]
    out += [
        ("accept:" + v["name"], v["frame_hex"], v["signed_hex"]) for v in doc["accept"] if "zstd" in v["name"]
    ]
    return out


def _without_zstd(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for v in doc["vectors"]:
        v.pop("frame_zstd_hex")
    for v in doc["accept"]:
        if v["name"] in ("zstd_no_dictionary", "zstd_checksum"):
            v.pop("frame_hex")
    return doc


def test_regenerating_gives_the_same_file(tmp_path):
    tool = _load_tool()
    assert tool.main(["--out", str(tmp_path)]) == 0
    new = json.loads((tmp_path / "v1.json").read_text(encoding="utf-8"))
    assert _without_zstd(new) == _without_zstd(DOC)
    for name in DOC["dictionaries"].values():
        assert (tmp_path / name).read_bytes() == (VECTOR_DIR / name).read_bytes()
    # compressed bytes may differ between zstd versions: they must decode to the same message
    for where, frame_hex, signed_hex in _zstd_frames(new):
        frame = iac.wire.decode_frame(bytes.fromhex(frame_hex), dictionaries=DICTS)
        assert frame.body.hex() == signed_hex, where
    # the committed file is what the tool writes (same zstd version: byte for byte)
    assert tool.main(["--out", str(VECTOR_DIR), "--check"]) == 0


def test_regenerating_keeps_compressed_frames_that_still_decode(tmp_path):
    tool = _load_tool()
    shutil.copy(VECTOR_DIR / "v1.json", tmp_path / "v1.json")
    for name in DOC["dictionaries"].values():
        shutil.copy(VECTOR_DIR / name, tmp_path / name)
    # pretend another zstd version made the first vector's frame: a raw-block zstd frame
    doc = json.loads((tmp_path / "v1.json").read_text(encoding="utf-8"))
    v = doc["vectors"][0]
    signed = bytes.fromhex(v["signed_hex"])
    other = wire_vectors.frame(FrameType.MESSAGE, 1, wire_vectors.zstd_raw(signed, v["dict_id"]))
    v["frame_zstd_hex"] = other.hex()
    doc["vectors"][1]["frame_zstd_hex"] = doc["vectors"][0]["frame_raw_hex"]  # stale: recompressed
    (tmp_path / "v1.json").write_text(tool.render(doc), encoding="utf-8")
    assert tool.main(["--out", str(tmp_path)]) == 0
    new = json.loads((tmp_path / "v1.json").read_text(encoding="utf-8"))
    assert new["vectors"][0]["frame_zstd_hex"] == other.hex()
    assert new["vectors"][1]["frame_zstd_hex"] == DOC["vectors"][1]["frame_zstd_hex"]
    assert _without_zstd(new) == _without_zstd(DOC)


def test_generated_python_code_matches_the_proto(tmp_path):
    """iac/_pb is what the pinned grpcio-tools makes from proto/iac.proto (`make proto`)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            "proto/iac.proto",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    for name in ("iac_pb2.py", "iac_pb2.pyi"):
        assert (tmp_path / name).read_bytes() == (ROOT / "iac" / "wire" / "_pb" / name).read_bytes(), (
            f"iac/_pb/{name} is stale: run `make proto`"
        )
