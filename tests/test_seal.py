"""End-to-end sealing: only the recipient reads it, the signature covers it, nobody can re-sign it."""

from __future__ import annotations

import struct

import nacl.bindings
import nacl.public
import pytest

from iac import Identity, MessageType
from iac.errors import ConfigError, MessageRejected
from iac.wire import Session
from iac.wire.message import build_message, open_message, sender_of, sign_message
from iac.wire.seal import (
    SEAL_HEADER_SIZE,
    SEAL_MAGIC,
    SEAL_OVERHEAD,
    open_sealed,
    seal_payload,
)

ALICE = Identity.from_seed(b"\x01" * 32)
BOB = Identity.from_seed(b"\x02" * 32)
MALLORY = Identity.from_seed(b"\x03" * 32)
T0 = 1_790_000_000_000_000
PAYLOAD = '{"name":"transfer","args":{"amount":100,"to":"ünïcødé"}}'


def sealed_message(
    sender: Identity = ALICE,
    to: Identity = BOB,
    payload: str = PAYLOAD,
    extra: bytes = b"\x00chunk\xff",
    session_id: int = 42,
    msg_id: int = 7,
):
    msg = build_message(
        sender=sender.agent_id,
        to=to.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=session_id),
        timestamp_us=T0,
        msg_id=msg_id,
    )
    seal_payload(sender, msg, to.agent_id, payload, extra)
    return msg


def wire(identity: Identity, msg) -> bytes:
    return sign_message(identity, msg)


def test_round_trip_through_the_wire():
    data = wire(ALICE, sealed_message())
    msg = open_message(data)
    assert msg.payload_json == "" and msg.extra_data == b""
    assert len(msg.sealed) == SEAL_OVERHEAD + SEAL_HEADER_SIZE + len(PAYLOAD.encode()) + len(b"\x00chunk\xff")
    assert PAYLOAD.encode() not in data  # a relay sees ciphertext only
    assert open_sealed(BOB, msg) == (PAYLOAD, b"\x00chunk\xff")


def test_empty_payload_and_large_ids():
    msg = sealed_message(payload="", extra=b"", session_id=2**64 - 1, msg_id=2**64 - 1)
    assert open_sealed(BOB, open_message(wire(ALICE, msg))) == ("", b"")


def test_each_seal_is_fresh():
    a, b = sealed_message(), sealed_message()
    assert a.sealed != b.sealed  # ephemeral key per seal


def test_only_the_recipient_can_open():
    msg = open_message(wire(ALICE, sealed_message()))
    with pytest.raises(MessageRejected, match="not addressed") as ei:
        open_sealed(MALLORY, msg)
    assert ei.value.reason == "unseal_failed"
    with pytest.raises(MessageRejected, match="not addressed") as exc_info:
        open_sealed(ALICE, msg)  # not even the sender
    assert exc_info.value.reason == "unseal_failed"
    # Mallory re-addresses the ciphertext to herself (and signs as herself): it does not decrypt
    stolen = build_message(
        sender=MALLORY.agent_id,
        to=MALLORY.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=T0,
        msg_id=7,
        sealed=msg.sealed,
    )
    with pytest.raises(MessageRejected, match="does not decrypt") as exc_info:
        open_sealed(MALLORY, open_message(wire(MALLORY, stolen)))
    assert exc_info.value.reason == "unseal_failed"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({}, "from"),  # same ids, Mallory's `from` and signature
        ({"session_id": 43}, "from, session_id"),
        ({"msg_id": 8}, "from, msg_id"),
    ],
)
def test_third_party_cannot_re_sign_someone_elses_ciphertext(change, field):
    """Mallory copies Alice's sealed bytes into a message of her own, signed by her: Bob refuses it."""
    original = open_message(wire(ALICE, sealed_message()))
    forged = build_message(
        sender=MALLORY.agent_id,
        to=BOB.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=change.get("session_id", original.session_id)),
        timestamp_us=T0 + 1,
        msg_id=change.get("msg_id", original.msg_id),
        sealed=original.sealed,
    )
    msg = open_message(wire(MALLORY, forged))  # her signature is valid...
    assert sender_of(msg) == MALLORY.agent_id
    with pytest.raises(MessageRejected, match=f"does not match the message \\({field}\\)") as ei:
        open_sealed(BOB, msg)  # ...but the inner header names Alice
    assert ei.value.reason == "sealed_header_mismatch"
    assert type(ei.value) is MessageRejected and ei.value.row.error == "unauthorized"
    assert ei.value.mismatched == tuple(field.split(", "))


def test_ciphertext_moved_to_other_ids_is_refused_even_by_its_author():
    """The ids are bound too: a sealed payload cannot be replayed under a new (session_id, msg_id)."""
    original = sealed_message(msg_id=7)
    moved = build_message(
        sender=ALICE.agent_id,
        to=BOB.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=T0,
        msg_id=8,
        sealed=original.sealed,
    )
    with pytest.raises(MessageRejected, match=r"\(msg_id\)") as exc_info:
        open_sealed(BOB, open_message(wire(ALICE, moved)))
    assert exc_info.value.reason == "sealed_header_mismatch"


def test_signature_covers_the_sealed_bytes():
    msg = sealed_message()
    data = bytearray(wire(ALICE, msg))
    i = bytes(data).index(msg.sealed) + len(msg.sealed) // 2
    data[i] ^= 0x01
    with pytest.raises(MessageRejected) as exc_info:
        open_message(bytes(data))
    assert exc_info.value.reason == "bad_signature"


def test_tampered_ciphertext_refused():
    """Even if a sender signs altered sealed bytes, the box's authenticator refuses them."""
    msg = sealed_message()
    sealed = bytearray(msg.sealed)
    sealed[-1] ^= 0x80
    msg.sealed = bytes(sealed)
    received = open_message(wire(ALICE, msg))
    with pytest.raises(MessageRejected, match="does not decrypt") as exc_info:
        open_sealed(BOB, received)
    assert exc_info.value.reason == "unseal_failed"
    msg.sealed = msg.sealed[: SEAL_OVERHEAD + SEAL_HEADER_SIZE - 1]
    with pytest.raises(MessageRejected, match="shorter") as exc_info:
        open_sealed(BOB, open_message(wire(ALICE, msg)))
    assert exc_info.value.reason == "unseal_failed"


def _box_to_bob(plain: bytes) -> bytes:
    bob_x = nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(BOB.public_key)
    return nacl.public.SealedBox(nacl.public.PublicKey(bob_x)).encrypt(plain)


def _header(magic: bytes = SEAL_MAGIC, payload_len: int = 2) -> bytes:
    return struct.pack(">12s32s32sQQI", magic, ALICE.public_key, BOB.public_key, 42, 7, payload_len)


@pytest.mark.parametrize(
    ("plain", "match"),
    [
        (_header(magic=b"iac-seal-v2\x00") + b"{}", "unknown header"),
        (_header(payload_len=3) + b"{}", "runs past"),
        (_header() + b"\xff\xfe", "not valid UTF-8"),
    ],
)
def test_malformed_inner_plaintext_refused(plain, match):
    msg = build_message(
        sender=ALICE.agent_id,
        to=BOB.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=T0,
        msg_id=7,
        sealed=_box_to_bob(plain),
    )
    with pytest.raises(MessageRejected, match=match) as exc_info:
        open_sealed(BOB, open_message(wire(ALICE, msg)))
    assert exc_info.value.reason == "unseal_failed"


def test_header_layout_is_as_documented():
    assert SEAL_MAGIC == b"iac-seal-v1\x00"
    assert SEAL_HEADER_SIZE == 96
    assert SEAL_OVERHEAD == 48
    # a box made by hand from the documented layout opens
    msg = build_message(
        sender=ALICE.agent_id,
        to=BOB.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=T0,
        msg_id=7,
        sealed=_box_to_bob(_header() + b"{}" + b"tail"),
    )
    assert open_sealed(BOB, open_message(wire(ALICE, msg))) == ("{}", b"tail")


def test_outer_message_must_not_carry_a_clear_payload_too():
    msg = sealed_message()
    msg.payload_json = '{"decoy": true}'
    with pytest.raises(MessageRejected, match="must not also carry") as exc_info:
        open_sealed(BOB, open_message(wire(ALICE, msg)))
    assert exc_info.value.reason == "unseal_failed"
    plain = build_message(
        sender=ALICE.agent_id, to=BOB.agent_id, msg_type=MessageType.PING, session=Session(), timestamp_us=T0
    )
    with pytest.raises(MessageRejected, match="not sealed") as exc_info:
        open_sealed(BOB, open_message(wire(ALICE, plain)))
    assert exc_info.value.reason == "unseal_failed"


def test_seal_refuses_misuse():
    def fresh(to: str = BOB.agent_id, **kw):
        return build_message(
            sender=ALICE.agent_id,
            to=to,
            msg_type=MessageType.COMMAND,
            session=Session(),
            timestamp_us=T0,
            **kw,
        )

    with pytest.raises(ConfigError, match="`from`"):
        seal_payload(MALLORY, fresh(), BOB.agent_id, "{}")
    with pytest.raises(ConfigError, match="broadcast"):
        seal_payload(ALICE, fresh(to=""), BOB.agent_id, "{}")
    with pytest.raises(ConfigError, match="`to`"):
        seal_payload(ALICE, fresh(), MALLORY.agent_id, "{}")
    with pytest.raises(ConfigError, match="stay empty"):
        seal_payload(ALICE, fresh(payload_json="{}"), BOB.agent_id, "{}")
    msg = fresh()
    seal_payload(ALICE, msg, BOB.agent_id, "{}")
    with pytest.raises(ConfigError, match="already sealed"):
        seal_payload(ALICE, msg, BOB.agent_id, "{}")
    with pytest.raises(ConfigError, match="UTF-8"):
        seal_payload(ALICE, fresh(), BOB.agent_id, "\ud800")
    # a well-formed id that is not a valid curve point cannot be sealed to
    bad = "00" * 32
    with pytest.raises(MessageRejected) as exc_info:
        seal_payload(ALICE, fresh(to=bad), bad, "{}")
    assert exc_info.value.reason == "invalid_agent_id"


def test_seal_then_sign_order_keeps_signature_valid():
    msg = sealed_message()
    first = wire(ALICE, msg)
    # a retransmission keeps the ids, re-signs with a fresh timestamp and reuses the sealed bytes
    msg.timestamp = T0 + 1_000
    again = open_message(wire(ALICE, msg))
    assert again.sealed == open_message(first).sealed
    assert open_sealed(BOB, again) == (PAYLOAD, b"\x00chunk\xff")
