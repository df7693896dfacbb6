"""proto/testvectors/dict-39616.zdict and dictionaries-v1.json: the shipped dictionary as other
implementations get it, and the pushed-dictionary derivation recomputed here from the rule in
docs/PROTOCOL.md ("Pushed dictionaries"), not from the code that wrote the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from iac.transport.base import TransportConfig
from iac.transport.session import DictState
from iac.wire._pb.iac_pb2 import Dict, Hello
from iac.wire.dicts import Dictionary, DictionarySet, default_dictionary
from iac.wire.frames import FrameType, decode_frame
from iac.wire.identity import Identity
from tools.vectors.dictionaries import OUT_DIR, VECTOR_FILE, render_dictionary_vectors

TEXT = VECTOR_FILE.read_text(encoding="utf-8")
DOC = json.loads(TEXT)
PACKAGE_DICT = Path(__file__).resolve().parent.parent / "iac" / "data" / "default.dict"


def test_file_is_what_the_generator_writes() -> None:
    assert render_dictionary_vectors(TEXT) == TEXT, "run `make vectors` and commit the result"


def test_shipped_copy_equals_the_package_dictionary_and_its_digest() -> None:
    shipped = DOC["shipped"]
    data = (OUT_DIR / shipped["file"]).read_bytes()
    assert data == PACKAGE_DICT.read_bytes() == default_dictionary().content
    assert hashlib.sha256(data).hexdigest() == shipped["sha256"]
    assert len(data) == shipped["size"]
    assert data[:4] == bytes.fromhex("37a430ec")  # a zstd dictionary
    assert int.from_bytes(data[4:8], "little") == shipped["dict_id"] == 39616
    assert shipped["file"] == "dict-39616.zdict"


def test_derivation_follows_the_documented_rule() -> None:
    v = DOC["derived"]
    base = (OUT_DIR / v["base"]).read_bytes()
    pusher = Identity.from_seed(bytes.fromhex(v["pusher_seed_hex"]))
    peer = Identity.from_seed(bytes.fromhex(v["peer_seed_hex"]))
    assert (pusher.agent_id, peer.agent_id) == (v["pusher"], v["peer"])
    # 0x0a 0x40 <peer> 0x12 0x40 <self>, then 0x0a 0x40 <self> 0x12 0x40 <peer> (ids as their hex text).
    p, s = peer.agent_id.encode(), pusher.agent_id.encode()
    tail = b"\x0a\x40" + p + b"\x12\x40" + s + b"\x0a\x40" + s + b"\x12\x40" + p
    assert tail.hex() == v["tail_hex"]
    hashed = base[:4] + bytes(4) + base[8:] + tail
    digest = hashlib.sha256(hashed).digest()
    assert digest.hex() == v["id_source_sha256"]
    dict_id = 65536 + int.from_bytes(digest[:8], "little") % (2**31 - 65536)
    assert dict_id == v["dict_id"]
    content = base[:4] + dict_id.to_bytes(4, "little") + base[8:] + tail
    assert len(content) == v["content_size"]
    assert hashlib.sha256(content).hexdigest() == v["sha256"]

    # The DICT frame: type DICT, compressed (flags bit 0) with the base dictionary, body a Dict.
    raw = bytes.fromhex(v["dict_frame_hex"])
    assert raw[0] == FrameType.DICT and raw[1] == 0x01
    frame = decode_frame(raw, dictionaries=DictionarySet([Dictionary(base)]))
    assert frame.dict_id == DOC["shipped"]["dict_id"]
    assert hashlib.sha256(frame.body).hexdigest() == v["dict_body_sha256"]
    assert Dict.FromString(frame.body) == Dict(
        dict_id=dict_id, sha256=hashlib.sha256(content).digest(), content=content
    )
    # DICT_ACK: raw (flags 0), a Dict with only dict_id and sha256.
    ack = bytes.fromhex(v["dict_ack_frame_hex"])
    assert ack[0] == FrameType.DICT_ACK and ack[1] == 0x00
    assert Dict.FromString(ack[3:]) == Dict(dict_id=dict_id, sha256=hashlib.sha256(content).digest())
    assert ack[2] == len(ack) - 3


def test_a_node_pushes_the_vector_dictionary_to_a_peer_that_does_not_elide() -> None:
    v = DOC["derived"]
    state = DictState(TransportConfig(dictionaries=DictionarySet([default_dictionary()])))
    frame = state.push_frame(v["pusher"], Hello(agent_id=v["peer"], dict_ids=[DOC["shipped"]["dict_id"]]))
    assert frame is not None
    decoded = decode_frame(frame, dictionaries=DictionarySet([default_dictionary()]))
    assert (decoded.type, decoded.dict_id) == (FrameType.DICT, DOC["shipped"]["dict_id"])
    assert hashlib.sha256(decoded.body).hexdigest() == v["dict_body_sha256"]
    # Toward a peer that announces elide/1 too, nothing is pushed.
    eliding = Hello(agent_id=v["peer"], dict_ids=[DOC["shipped"]["dict_id"]], capabilities=["elide/1"])
    assert (
        DictState(TransportConfig(dictionaries=DictionarySet([default_dictionary()]))).push_frame(
            v["pusher"], eliding
        )
        is None
    )
