"""Signed records, rotation and revocation statements (iac.protocol.records, iac.protocol.statements),
and their test vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nacl.bindings
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iac import ConfigError, Identity
from iac.errors import REASONS, MessageRejected
from iac.protocol.canonical import MAX_SAFE_INT, canonical_json
from iac.protocol.records import (
    AgentRecord,
    SignedRecord,
    decode_record,
    is_address,
    is_alias,
    is_capability,
    open_record,
    sign_record,
)
from iac.protocol.statements import (
    Revocation,
    RotationStatement,
    SignedRevocation,
    SignedRotation,
    key_digest,
    open_revocation,
    open_rotation,
    sign_revocation,
    sign_rotation,
)
from iac.wire import Domain
from tools.vectors import points
from tools.vectors.records import check_negative_vector, dump_vectors, make_vectors

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "proto" / "testvectors" / "records-v1.json"
NOW = 1_700_000_000_000_000
HOUR = 3_600_000_000

ALICE = Identity.from_seed(b"\x01" * 32)
ALICE_NEXT = Identity.from_seed(b"\x02" * 32)
MALLORY = Identity.from_seed(b"\x03" * 32)


def record(**fields: Any) -> AgentRecord:
    base: dict[str, Any] = {"agent_id": ALICE.agent_id, "seq": 1, "expires_us": NOW + HOUR}
    return AgentRecord(**(base | fields))


def resign(data: bytes, identity: Identity = ALICE) -> tuple[bytes, bytes]:
    return data, identity.sign(Domain.RECORD, data)


# --- records -----------------------------------------------------------------------------------


def test_sign_and_open_round_trip() -> None:
    rec = record(
        aliases=("planner.team-a", "planner"),
        addresses=("tls://127.0.0.1:4433", "quic://[::1]:4433", "unix:///run/iac/a.sock"),
        capabilities=("plan", "delegate:research"),
        next_key_digest=key_digest(ALICE_NEXT.agent_id),
    )
    assert rec.aliases == ("planner", "planner.team-a")  # sets are kept sorted
    assert rec.addresses[0] == "tls://127.0.0.1:4433"  # preference order kept
    signed = sign_record(ALICE, rec)
    assert signed.data == canonical_json(rec.to_json_obj())
    assert json.loads(signed.data) == rec.to_json_obj()
    assert b" " not in signed.data
    assert open_record(signed.data, signed.signature, NOW) == rec
    assert SignedRecord.from_json_obj(json.loads(json.dumps(signed.to_json_obj()))) == signed


def test_canonical_encoding_is_sorted_compact_json() -> None:
    data = record(seq=5).encode()
    assert data == (
        b'{"addresses":[],"agent_id":"' + ALICE.agent_id.encode() + b'","aliases":[],"capabilities":[],'
        b'"expires_us":' + str(NOW + HOUR).encode() + b',"seq":5}'
    )


SMALL_ORDER_KEY = points.encode(points.ORDER_8).hex()
MIXED_ORDER_KEY = points.mixed_order(ALICE.agent_id)


@pytest.mark.parametrize("agent_id", [SMALL_ORDER_KEY, MIXED_ORDER_KEY, "01" + "00" * 31])
def test_a_key_that_is_not_an_agent_id_is_refused_in_a_record(agent_id: str) -> None:
    with pytest.raises(ConfigError, match="not an AgentId"):
        record(agent_id=agent_id)
    data = canonical_json(record().to_json_obj() | {"agent_id": agent_id})
    with pytest.raises(MessageRejected) as exc_info:
        decode_record(data)
    assert exc_info.value.reason == "invalid_agent_id"
    with pytest.raises(MessageRejected) as exc_info:  # before expiry and signature
        open_record(data, bytes(64), NOW + 2 * HOUR)
    assert exc_info.value.reason == "invalid_agent_id"


def test_the_mixed_order_record_vector_has_a_signature_libsodium_accepts() -> None:
    """Only the AgentId check refuses it: libsodium's signature check alone would accept the record."""
    (vector,) = (v for v in DOC["negative"] if v["name"] == "mixed-order-agent-id")
    data = vector["data"].encode("ascii")
    key = bytes.fromhex(json.loads(data)["agent_id"])
    nacl.bindings.crypto_sign_open(bytes.fromhex(vector["signature_hex"]) + b"iac-record-v1\x00" + data, key)
    with pytest.raises(MessageRejected) as exc_info:
        check_negative_vector(vector)
    assert exc_info.value.reason == "invalid_agent_id"


def test_only_the_described_key_signs_its_record() -> None:
    with pytest.raises(ConfigError):
        sign_record(MALLORY, record())


@pytest.mark.parametrize("index", [0, 40, 100, -2])
def test_tampered_record_is_refused(index: int) -> None:
    signed = sign_record(ALICE, record(aliases=("a",), capabilities=("x",)))
    data = bytearray(signed.data)
    data[index] ^= 0x01
    with pytest.raises(MessageRejected) as exc_info:
        open_record(bytes(data), signed.signature, NOW)
    assert exc_info.value.reason in ("bad_signature", "bad_record", "invalid_agent_id")


def test_tampered_field_value_fails_the_signature() -> None:
    signed = sign_record(ALICE, record(seq=7))
    with pytest.raises(MessageRejected) as exc_info:
        open_record(signed.data.replace(b'"seq":7', b'"seq":8'), signed.signature, NOW)
    assert exc_info.value.reason == "bad_signature"
    sig = bytearray(signed.signature)
    sig[5] ^= 0x80
    with pytest.raises(MessageRejected) as exc_info:
        open_record(signed.data, bytes(sig), NOW)
    assert exc_info.value.reason == "bad_signature"


def test_signature_in_another_domain_or_by_another_key_is_refused() -> None:
    data = record().encode()
    for sig in (
        ALICE.sign(Domain.MESSAGE, data),
        ALICE.sign(Domain.ROTATE, data),
        MALLORY.sign(Domain.RECORD, data),
    ):
        with pytest.raises(MessageRejected) as exc_info:
            open_record(data, sig, NOW)
        assert exc_info.value.reason == "bad_signature"
    with pytest.raises(MessageRejected) as exc_info:
        open_record(data, b"\x00" * 63, NOW)
    assert exc_info.value.reason == "bad_record"


def test_expiry() -> None:
    signed = sign_record(ALICE, record(expires_us=NOW + 1))
    assert open_record(signed.data, signed.signature, NOW).expires_us == NOW + 1
    for now in (NOW + 1, NOW + HOUR):
        with pytest.raises(MessageRejected) as exc_info:
            open_record(signed.data, signed.signature, now)
        assert exc_info.value.reason == "record_expired"


@pytest.mark.parametrize(
    "alias",
    ["a", "planner", "planner.team-a", "x1.y-2.z3", "a" * 63, ".".join(["a" * 63] * 3) + "." + "b" * 61],
)
def test_good_aliases(alias: str) -> None:
    assert is_alias(alias)


@pytest.mark.parametrize(
    "alias",
    ["", "Planner", "-a", "a-", "a..b", ".a", "a.", "a_b", "a b", "a" * 64, ".".join(["a" * 63] * 4), "é"],
)
def test_bad_aliases(alias: str) -> None:
    assert not is_alias(alias)
    with pytest.raises(ConfigError):
        record(aliases=(alias,))


@pytest.mark.parametrize(
    "address",
    [
        "quic://203.0.113.5:4433",
        "tls://host.example:1",
        "tls://[2001:db8::1]:65535",
        "unix:///run/iac/x.sock",
    ],
)
def test_good_addresses(address: str) -> None:
    assert is_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "http://a:1",
        "tls://a",
        "tls://a:0",
        "tls://a:65536",
        "tls://a:01",
        "tls://Host:1",
        "tls://a:1/path",
        "unix://relative",
        "unix:///with space",
        "quic://a:1 ",
        "tls://user@a:1",
    ],
)
def test_bad_addresses(address: str) -> None:
    assert not is_address(address)


@pytest.mark.parametrize("cap", ["plan", "delegate:research", "tool/web.search", "a", "x" * 64])
def test_good_capabilities(cap: str) -> None:
    assert is_capability(cap)


@pytest.mark.parametrize("cap", ["", "Plan", ":x", "a b", "x" * 65, "ü"])
def test_bad_capabilities(cap: str) -> None:
    assert not is_capability(cap)


@pytest.mark.parametrize(
    "fields",
    [
        {"seq": -1},
        {"seq": MAX_SAFE_INT + 1},
        {"expires_us": 1.5},
        {"agent_id": ALICE.agent_id.upper()},
        {"aliases": ("a", "a")},
        {"addresses": ("tls://a:1", "tls://a:1")},
        {"capabilities": ("x",) * 2},
        {"capabilities": tuple(f"c{i}" for i in range(65))},
        {"next_key_digest": "AB" * 32},
        {"next_key_digest": ""},
    ],
)
def test_record_fields_are_validated_on_construction(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        record(**fields)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.replace(b'"seq":1', b'"seq": 1'),
        lambda d: d + b"\n",
        lambda d: d.replace(b'"seq":1', b'"seq":1,"seq":1'),
        lambda d: d.replace(b'"seq":1', b'"seq":1.0'),
        lambda d: d.replace(b'"seq":1', b'"seq":1e0'),
        lambda d: d.replace(b'"seq":1', b'"seq":NaN'),
        lambda d: d.replace(b'"aliases":[]', b'"aliases":["\\u0061"]'),
        lambda d: d.replace(b'"aliases":[]', b'"aliases":["b","a"]'),
        lambda d: d.replace(b'"aliases":[]', b'"aliases":null'),
        lambda d: d.replace(b'"aliases":[]', b'"aliases":["caf\xc3\xa9"]'),
        lambda d: d.replace(b'"aliases":[],', b""),
        lambda d: d.replace(b'"seq":1', b'"seq":1,"zzz":0'),
        lambda d: d.replace(b'"seq":1', b'"seq":"1"'),
        lambda d: b"[" + d + b"]",
        lambda d: b"{" + b"{}" * 10_000,
    ],
    ids=[
        "space",
        "newline",
        "duplicate",
        "float",
        "exponent",
        "nan",
        "needless-escape",
        "unsorted-set",
        "null",
        "utf8",
        "missing",
        "unknown",
        "string-int",
        "array",
        "garbage",
    ],
)
def test_non_canonical_or_off_schema_bytes_never_verify(mutate: Any) -> None:
    data, sig = resign(mutate(record().encode()))
    with pytest.raises(MessageRejected) as exc_info:
        open_record(data, sig, NOW)
    assert exc_info.value.reason == "bad_record"


def test_record_size_limit() -> None:
    signed = sign_record(ALICE, record(capabilities=tuple(f"capability-{i:03}" for i in range(60))))
    open_record(signed.data, signed.signature, NOW)
    with pytest.raises(MessageRejected, match="over the limit") as exc_info:
        open_record(signed.data, signed.signature, NOW, max_size=len(signed.data) - 1)
    assert exc_info.value.reason == "bad_record"


def test_largest_integers_round_trip() -> None:
    rec = record(seq=MAX_SAFE_INT, expires_us=MAX_SAFE_INT)
    assert decode_record(rec.encode()) == rec


# --- rotation ----------------------------------------------------------------------------------


def test_rotation_signed_by_both_keys() -> None:
    signed = sign_rotation(ALICE, ALICE_NEXT, seq=2, issued_us=NOW)
    st = open_rotation(signed, NOW, next_key_digest=key_digest(ALICE_NEXT.agent_id))
    assert st == RotationStatement(ALICE.agent_id, ALICE_NEXT.agent_id, 2, NOW)
    assert open_rotation(signed, NOW, next_key_digest=None) == st
    assert SignedRotation.from_json_obj(signed.to_json_obj()) == signed


def test_a_stolen_key_cannot_rotate_to_an_uncommitted_key() -> None:
    signed = sign_rotation(ALICE, MALLORY, seq=2, issued_us=NOW)
    with pytest.raises(MessageRejected) as exc_info:
        open_rotation(signed, NOW, next_key_digest=key_digest(ALICE_NEXT.agent_id))
    assert exc_info.value.reason == "uncommitted_successor"


def test_rotation_needs_the_new_keys_countersignature() -> None:
    good = sign_rotation(ALICE, ALICE_NEXT, seq=2, issued_us=NOW)
    for bad in (
        SignedRotation(good.data, good.old_signature, good.old_signature),
        SignedRotation(good.data, good.old_signature, MALLORY.sign(Domain.ROTATE, good.data)),
        SignedRotation(good.data, good.new_signature, good.new_signature),
        SignedRotation(good.data, ALICE.sign(Domain.REVOKE, good.data), good.new_signature),
    ):
        with pytest.raises(MessageRejected) as exc_info:
            open_rotation(bad, NOW, next_key_digest=None)
        assert exc_info.value.reason == "bad_signature"


def test_rotation_from_the_future_or_to_itself_is_refused() -> None:
    signed = sign_rotation(ALICE, ALICE_NEXT, seq=2, issued_us=NOW + HOUR)
    with pytest.raises(MessageRejected, match="future") as exc_info:
        open_rotation(signed, NOW, next_key_digest=None)
    assert exc_info.value.reason == "bad_record"
    with pytest.raises(ConfigError):
        sign_rotation(ALICE, ALICE, seq=2, issued_us=NOW)
    data = canonical_json(
        {"issued_us": NOW, "new_agent_id": ALICE.agent_id, "old_agent_id": ALICE.agent_id, "seq": 2}
    )
    same = SignedRotation(data, ALICE.sign(Domain.ROTATE, data), ALICE.sign(Domain.ROTATE, data))
    with pytest.raises(MessageRejected) as exc_info:
        open_rotation(same, NOW, next_key_digest=None)
    assert exc_info.value.reason == "bad_record"


# --- revocation --------------------------------------------------------------------------------


def test_revocation_round_trip_with_escaped_reason() -> None:
    signed = sign_revocation(ALICE, seq=3, issued_us=NOW, reason='lost "k1" at C:\\x')
    assert b'\\"k1\\"' in signed.data and b"C:\\\\x" in signed.data
    assert open_revocation(signed, NOW) == Revocation(ALICE.agent_id, 3, NOW, 'lost "k1" at C:\\x')
    assert SignedRevocation.from_json_obj(signed.to_json_obj()) == signed


def test_revocation_must_be_signed_by_the_key_itself() -> None:
    signed = sign_revocation(ALICE, seq=3, issued_us=NOW)
    for sig in (ALICE_NEXT.sign(Domain.REVOKE, signed.data), ALICE.sign(Domain.ROTATE, signed.data)):
        with pytest.raises(MessageRejected) as exc_info:
            open_revocation(SignedRevocation(signed.data, sig), NOW)
        assert exc_info.value.reason == "bad_signature"


@pytest.mark.parametrize("reason", ["x" * 257, "tab\there", "é"])
def test_revocation_reason_limits(reason: str) -> None:
    with pytest.raises(ConfigError):
        sign_revocation(ALICE, seq=1, issued_us=NOW, reason=reason)


@pytest.mark.parametrize(
    "envelope",
    [
        {},
        {"record": "{}"},
        {"record": "{}", "signature": "00"},
        {"record": "{}", "signature": "AA" * 64},
        {"record": 5, "signature": "00" * 64},
        {"record": "{}", "signature": "00" * 64, "extra": 1},
        [],
    ],
)
def test_malformed_envelopes(envelope: Any) -> None:
    with pytest.raises(MessageRejected) as exc_info:
        SignedRecord.from_json_obj(envelope)
    assert exc_info.value.reason == "bad_record"


# --- test vectors ------------------------------------------------------------------------------

DOC: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_committed_vectors_match_a_fresh_generation() -> None:
    assert make_vectors() == DOC
    assert VECTORS.read_text(encoding="utf-8") == dump_vectors(), (
        "regenerate with `python -m tools.vectors.records`"
    )


@pytest.mark.parametrize("vector", DOC["records"], ids=[v["name"] for v in DOC["records"]])
def test_record_vectors_rederive(vector: dict[str, Any]) -> None:
    ident = Identity.from_seed(bytes.fromhex(vector["seed_hex"]))
    assert ident.agent_id == vector["agent_id"]
    fields = vector["record"]
    rec = AgentRecord(
        agent_id=fields["agent_id"],
        seq=fields["seq"],
        expires_us=fields["expires_us"],
        aliases=tuple(fields["aliases"]),
        addresses=tuple(fields["addresses"]),
        capabilities=tuple(fields["capabilities"]),
        next_key_digest=fields.get("next_key_digest"),
    )
    signed = sign_record(ident, rec)
    assert signed.data.decode() == vector["canonical"]
    assert signed.signature.hex() == vector["signature_hex"]
    assert open_record(signed.data, signed.signature, DOC["now_us"]) == rec
    env = SignedRecord.from_json_obj(json.loads(vector["envelope"]))
    assert env == signed


@pytest.mark.parametrize("vector", DOC["rotations"], ids=[v["name"] for v in DOC["rotations"]])
def test_rotation_vectors_rederive(vector: dict[str, Any]) -> None:
    old = Identity.from_seed(bytes.fromhex(vector["old_seed_hex"]))
    new = Identity.from_seed(bytes.fromhex(vector["new_seed_hex"]))
    st = vector["statement"]
    signed = sign_rotation(old, new, seq=st["seq"], issued_us=st["issued_us"])
    assert signed.data.decode() == vector["canonical"]
    assert signed.old_signature.hex() == vector["old_signature_hex"]
    assert signed.new_signature.hex() == vector["new_signature_hex"]
    assert key_digest(new.agent_id) == vector["next_key_digest"]
    open_rotation(signed, DOC["now_us"], next_key_digest=vector["next_key_digest"])
    assert SignedRotation.from_json_obj(json.loads(vector["envelope"])) == signed


@pytest.mark.parametrize("vector", DOC["revocations"], ids=[v["name"] for v in DOC["revocations"]])
def test_revocation_vectors_rederive(vector: dict[str, Any]) -> None:
    ident = Identity.from_seed(bytes.fromhex(vector["seed_hex"]))
    st = vector["statement"]
    signed = sign_revocation(ident, seq=st["seq"], issued_us=st["issued_us"], reason=st["reason"])
    assert signed.data.decode() == vector["canonical"]
    assert signed.signature.hex() == vector["signature_hex"]
    open_revocation(signed, DOC["now_us"])
    assert SignedRevocation.from_json_obj(json.loads(vector["envelope"])) == signed


@pytest.mark.parametrize("vector", DOC["negative"], ids=[v["name"] for v in DOC["negative"]])
def test_negative_vectors_fail_with_their_named_error(vector: dict[str, Any]) -> None:
    assert vector["error"] in REASONS
    with pytest.raises(Exception) as info:
        check_negative_vector(vector)
    assert getattr(info.value, "reason", None) == vector["error"], info.value


# --- property: any valid record survives encode / sign / open unchanged ---------------------

_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
_aliases = st.lists(st.lists(_label, min_size=1, max_size=3).map(".".join), max_size=5, unique=True)
_caps = st.lists(st.from_regex(r"[a-z0-9][a-z0-9._:/-]{0,20}", fullmatch=True), max_size=5, unique=True)
_ints = st.integers(min_value=0, max_value=MAX_SAFE_INT)


@settings(max_examples=60, deadline=None)
@given(
    aliases=_aliases, caps=_caps, seq=_ints, expires=st.integers(min_value=NOW + 1, max_value=MAX_SAFE_INT)
)
def test_valid_records_round_trip(aliases: list[str], caps: list[str], seq: int, expires: int) -> None:
    rec = record(aliases=tuple(aliases), capabilities=tuple(caps), seq=seq, expires_us=expires)
    signed = sign_record(ALICE, rec)
    assert open_record(signed.data, signed.signature, NOW) == rec
    assert json.loads(signed.data) == rec.to_json_obj()
