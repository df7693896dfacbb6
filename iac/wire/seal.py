"""End-to-end sealing: a payload only the recipient can read, bound to the message that carries it.

The sender encrypts the payload to the recipient's X25519 key, derived from
its Ed25519 key (its AgentId), with libsodium's sealed box (an ephemeral
X25519 key, XSalsa20-Poly1305; the box adds 48 bytes). The ciphertext goes in
the message's ``sealed`` field (13); ``payload_json`` and ``extra_data`` stay
empty. ``sealed`` is an ordinary field, so the message signature covers it and
relays carry it without reading it.

A sealed box is anonymous: it does not say who made it. The *sealed plaintext*
therefore repeats the outer message's ``from``, ``to``, ``session_id`` and
``msg_id``, and the recipient checks them against the outer message. Someone
who copies another sender's ciphertext into a message of their own (their
``from``, signed with their key) is refused: the inner ``from`` names the real
author. A relay cannot move it to another session or id either, because the
signature covers those fields and the inner header repeats them.

Sealed plaintext, byte by byte (all integers big-endian)::

    offset  size  field
    0       12    magic: ASCII "iac-seal-v1" followed by one 0x00 byte
    12      32    from: the sender's Ed25519 public key (the AgentId, raw)
    44      32    to: the recipient's Ed25519 public key
    76      8     session_id (u64)
    84      8     msg_id (u64)
    92      4     payload_len (u32): length of the UTF-8 payload_json
    96      *     payload_json (payload_len bytes, UTF-8)
    96+len  *     extra_data (the rest)

The header is 96 bytes, so a sealed field is at least 96 + 48 = 144 bytes.
"""

from __future__ import annotations

import struct

import nacl.bindings
import nacl.exceptions
import nacl.public

from iac.errors import ConfigError, MessageRejected
from iac.wire._pb.iac_pb2 import Message
from iac.wire.identity import Identity, check_agent_id
from iac.wire.message import sender_of

SEAL_MAGIC = b"iac-seal-v1\x00"
_HEADER = struct.Struct(">12s32s32sQQI")
#: Size of the inner header in front of the payload.
SEAL_HEADER_SIZE = _HEADER.size
#: What a sealed box adds: an ephemeral public key (32) and a Poly1305 tag (16).
SEAL_OVERHEAD = nacl.bindings.crypto_box_SEALBYTES


def _x25519_public(agent_id: str) -> bytes:
    """The X25519 public key of an AgentId (the birational map of its Ed25519 key)."""
    try:
        key: bytes = nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(
            bytes.fromhex(check_agent_id(agent_id))
        )
    except nacl.exceptions.RuntimeError:
        raise MessageRejected(
            f"{agent_id[:16]}… is not a valid Ed25519 key; cannot seal to it", reason="invalid_agent_id"
        ) from None
    return key


def _x25519_private(identity: Identity) -> nacl.public.PrivateKey:
    _, secret = nacl.bindings.crypto_sign_seed_keypair(identity.seed())
    return nacl.public.PrivateKey(nacl.bindings.crypto_sign_ed25519_sk_to_curve25519(secret))


def seal_payload(
    identity: Identity, msg: Message, recipient_agent_id: str, payload_json: str, extra_data: bytes = b""
) -> None:
    """Seal ``payload_json`` and ``extra_data`` to the recipient; set ``msg.sealed``.

    Call it after ``session_id`` and ``msg_id`` are final and before signing
    (the signature must cover the sealed bytes). A retransmission keeps the ids,
    so it may reuse ``msg.sealed`` as it is.

    Raises :class:`~iac.ConfigError` when ``msg`` is not from ``identity``, is not
    addressed to ``recipient_agent_id`` (a broadcast cannot be sealed), already
    has a payload, or is already sealed; ``invalid_agent_id`` when the
    recipient is not a valid key.
    """
    sender = sender_of(msg)
    if sender != identity.agent_id:
        raise ConfigError("a message is sealed by the identity in its `from` field")
    if not msg.to:
        raise ConfigError("a broadcast (empty `to`) cannot be sealed")
    if msg.to != recipient_agent_id:
        raise ConfigError("seal to the message's `to`: the recipient checks it against the sealed header")
    if msg.payload_json or msg.extra_data:
        raise ConfigError(
            "pass the payload to seal_payload; the message's payload_json and extra_data stay empty"
        )
    if msg.sealed:
        raise ConfigError("the message is already sealed")
    recipient_key = _x25519_public(recipient_agent_id)
    try:
        payload = payload_json.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("payload_json is not valid UTF-8 text") from None
    header = _HEADER.pack(
        SEAL_MAGIC,
        bytes.fromhex(sender),
        bytes.fromhex(recipient_agent_id),
        msg.session_id,
        msg.msg_id,
        len(payload),
    )
    box = nacl.public.SealedBox(nacl.public.PublicKey(recipient_key))
    msg.sealed = box.encrypt(header + payload + bytes(extra_data))
    msg.signature = b""  # any earlier signature no longer covers the message


def open_sealed(identity: Identity, msg: Message) -> tuple[str, bytes]:
    """Open a sealed message addressed to ``identity``; return ``(payload_json, extra_data)``.

    Run it after the message's signature verified (the outer ``from`` is then
    proved). Raises ``sealed_header_mismatch`` when the
    inner header does not repeat the outer ``from``, ``to``, ``session_id`` and
    ``msg_id``, and ``unseal_failed`` when the message is not
    sealed, carries a clear payload beside the seal, is not addressed to
    ``identity``, does not decrypt, or its plaintext is malformed.
    """
    if not msg.sealed:
        raise MessageRejected("message is not sealed", reason="unseal_failed")
    if msg.payload_json or msg.extra_data:
        raise MessageRejected(
            "a sealed message must not also carry payload_json or extra_data", reason="unseal_failed"
        )
    if msg.to != identity.agent_id:
        raise MessageRejected("sealed message is not addressed to this agent", reason="unseal_failed")
    if len(msg.sealed) < SEAL_OVERHEAD + SEAL_HEADER_SIZE:
        raise MessageRejected(
            f"sealed payload is {len(msg.sealed)} bytes, shorter than its fixed parts", reason="unseal_failed"
        )
    try:
        plain = nacl.public.SealedBox(_x25519_private(identity)).decrypt(msg.sealed)
    except nacl.exceptions.CryptoError:
        raise MessageRejected(
            "sealed payload does not decrypt with this agent's key", reason="unseal_failed"
        ) from None
    if len(plain) < SEAL_HEADER_SIZE:
        raise MessageRejected("sealed plaintext is shorter than its header", reason="unseal_failed")
    magic, inner_from, inner_to, session_id, msg_id, payload_len = _HEADER.unpack_from(plain)
    if magic != SEAL_MAGIC:
        raise MessageRejected(
            "sealed plaintext has an unknown header (expected iac-seal-v1)", reason="unseal_failed"
        )
    mismatched = [
        name
        for name, inner, outer in (
            ("from", inner_from.hex(), sender_of(msg)),
            ("to", inner_to.hex(), msg.to),
            ("session_id", session_id, msg.session_id),
            ("msg_id", msg_id, msg.msg_id),
        )
        if inner != outer
    ]
    if mismatched:
        raise MessageRejected(
            f"sealed header does not match the message ({', '.join(mismatched)}): "
            "the ciphertext was made for another message",
            reason="sealed_header_mismatch",
            mismatched=tuple(mismatched),
        )
    end = SEAL_HEADER_SIZE + payload_len
    if end > len(plain):
        raise MessageRejected(
            f"sealed payload_len {payload_len} runs past the plaintext", reason="unseal_failed"
        )
    try:
        payload_json = plain[SEAL_HEADER_SIZE:end].decode("utf-8")
    except UnicodeDecodeError:
        raise MessageRejected("sealed payload_json is not valid UTF-8", reason="unseal_failed") from None
    return payload_json, plain[end:]


__all__ = [
    "SEAL_HEADER_SIZE",
    "SEAL_MAGIC",
    "SEAL_OVERHEAD",
    "open_sealed",
    "seal_payload",
]
