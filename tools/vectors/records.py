"""Write proto/testvectors/records-v1.json: signed records, rotations, revocations, negatives.

    .venv/bin/python -m tools.vectors.records

Fixed seeds and a fixed clock, so the output is deterministic. :func:`check_negative_vector`
runs one negative vector through the opener of its kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iac.errors import ConfigError
from iac.protocol.canonical import MAX_SAFE_INT, canonical_json
from iac.protocol.records import AgentRecord, SignedRecord, decode_record, open_record, sign_record
from iac.protocol.statements import (
    Revocation,
    SignedRevocation,
    SignedRotation,
    decode_revocation,
    decode_rotation,
    key_digest,
    open_revocation,
    open_rotation,
    sign_revocation,
    sign_rotation,
)
from iac.wire.identity import Domain, Identity, signing_input
from tools.vectors import points, render, write

ROOT = Path(__file__).resolve().parent.parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "records-v1.json"

VECTORS_VERSION = 1
#: Fixed clock of the vectors (2025-01-01T00:00:00Z in µs).
VECTOR_NOW_US = 1_735_689_600_000_000


def _seed(n: int) -> bytes:
    return bytes([n]) * 32


@dataclass(slots=True)
class _VectorBuilder:
    records: list[dict[str, Any]] = field(default_factory=list)
    rotations: list[dict[str, Any]] = field(default_factory=list)
    revocations: list[dict[str, Any]] = field(default_factory=list)
    negative: list[dict[str, Any]] = field(default_factory=list)

    def record(self, name: str, description: str, seed: int, **fields: Any) -> SignedRecord:
        ident = Identity.from_seed(_seed(seed))
        rec = AgentRecord(agent_id=ident.agent_id, **fields)
        signed = sign_record(ident, rec)
        self.records.append(
            {
                "name": name,
                "description": description,
                "seed_hex": _seed(seed).hex(),
                "agent_id": ident.agent_id,
                "record": rec.to_json_obj(),
                "canonical": signed.data.decode("ascii"),
                "signature_hex": signed.signature.hex(),
                "envelope": canonical_json(signed.to_json_obj()).decode("ascii"),
            }
        )
        return signed

    def neg(
        self, name: str, description: str, kind: str, payload: dict[str, str], error: str, **extra: Any
    ) -> None:
        self.negative.append(
            {
                "name": name,
                "description": description,
                "kind": kind,
                "now_us": VECTOR_NOW_US,
                **payload,
                **extra,
            }
            | {"error": error}
        )


def _raw_record(obj: dict[str, Any], seed: int, *, encode: bytes | None = None) -> dict[str, str]:
    """A negative record payload: arbitrary bytes, validly signed by ``seed`` in ``iac-record-v1``."""
    data = encode if encode is not None else canonical_json(obj)
    sig = Identity.from_seed(_seed(seed)).sign(Domain.RECORD, data)
    return {"data": data.decode("ascii"), "signature_hex": sig.hex()}


def make_vectors() -> dict[str, Any]:
    """Deterministic test vectors for records, rotations and revocations (fixed seeds and clock).

    Written to ``proto/testvectors/records-v1.json`` by :func:`dump_vectors`.
    """
    b = _VectorBuilder()
    now = VECTOR_NOW_US
    hour = 3_600_000_000
    alice, alice_next, mallory = (Identity.from_seed(_seed(n)) for n in (1, 2, 3))

    b.record("minimal", "no alias, address or capability", 1, seq=1, expires_us=now + hour)
    full = b.record(
        "full",
        "aliases and capabilities sorted, addresses in preference order, committed successor (seed 2)",
        1,
        seq=7,
        expires_us=now + hour,
        aliases=("planner.team-a", "planner"),
        addresses=("quic://203.0.113.5:4433", "tls://[2001:db8::1]:4434", "unix:///run/iac/planner.sock"),
        capabilities=("plan", "delegate:research"),
        next_key_digest=key_digest(alice_next.agent_id),
    )
    b.record(
        "max-integers",
        "seq and expires_us at 2**53 - 1",
        4,
        seq=MAX_SAFE_INT,
        expires_us=MAX_SAFE_INT,
        capabilities=("a",),
    )

    rot = sign_rotation(alice, alice_next, seq=8, issued_us=now)
    b.rotations.append(
        {
            "name": "committed",
            "description": "seed 1 rotates to seed 2, the successor committed in the 'full' record",
            "old_seed_hex": _seed(1).hex(),
            "new_seed_hex": _seed(2).hex(),
            "statement": decode_rotation(rot.data).to_json_obj(),
            "canonical": rot.data.decode("ascii"),
            "old_signature_hex": rot.old_signature.hex(),
            "new_signature_hex": rot.new_signature.hex(),
            "next_key_digest": key_digest(alice_next.agent_id),
            "envelope": canonical_json(rot.to_json_obj()).decode("ascii"),
        }
    )
    revs = [
        ("self", "seed 1 revokes itself", 1, "key compromised"),
        (
            "escapes",
            "a reason with the two escaped characters (quote and backslash)",
            4,
            'lost "k1" in C:\\keys',
        ),
    ]
    for name, description, seed, reason in revs:
        signed_rev = sign_revocation(Identity.from_seed(_seed(seed)), seq=9, issued_us=now, reason=reason)
        b.revocations.append(
            {
                "name": name,
                "description": description,
                "seed_hex": _seed(seed).hex(),
                "statement": decode_revocation(signed_rev.data).to_json_obj(),
                "canonical": signed_rev.data.decode("ascii"),
                "signature_hex": signed_rev.signature.hex(),
                "envelope": canonical_json(signed_rev.to_json_obj()).decode("ascii"),
            }
        )
    rev = sign_revocation(alice, seq=9, issued_us=now, reason="key compromised")

    # --- negative records: each signed validly over the bytes shown, so only the named check fails
    base = decode_record(full.data).to_json_obj()
    tampered = full.data.replace(b'"seq":7', b'"seq":8')
    b.neg(
        "tampered",
        "seq changed after signing",
        "record",
        {"data": tampered.decode("ascii"), "signature_hex": full.signature.hex()},
        "bad_signature",
    )
    b.neg(
        "wrong-domain",
        "signed in iac-msg-v1 instead of iac-record-v1",
        "record",
        {"data": full.data.decode("ascii"), "signature_hex": alice.sign(Domain.MESSAGE, full.data).hex()},
        "bad_signature",
    )
    b.neg(
        "wrong-signer",
        "signed by another key than agent_id",
        "record",
        {"data": full.data.decode("ascii"), "signature_hex": mallory.sign(Domain.RECORD, full.data).hex()},
        "bad_signature",
    )
    b.neg(
        "expired",
        "expires_us equal to now",
        "record",
        _raw_record(base | {"expires_us": now}, 1),
        "record_expired",
    )
    spaced = json.dumps(base, sort_keys=True).encode()
    b.neg(
        "whitespace",
        "not canonical: spaces after separators",
        "record",
        _raw_record(base, 1, encode=spaced),
        "bad_record",
    )
    unsorted = json.dumps(base, separators=(",", ":")).encode()
    if unsorted == canonical_json(base):  # pragma: no cover - the keys above are built sorted
        unsorted = json.dumps(dict(reversed(base.items())), separators=(",", ":")).encode()
    b.neg(
        "unsorted-keys",
        "not canonical: keys out of order",
        "record",
        _raw_record(base, 1, encode=unsorted),
        "bad_record",
    )
    dup = canonical_json(base).replace(b'"seq":7', b'"seq":7,"seq":7')
    b.neg("duplicate-key", "seq twice", "record", _raw_record(base, 1, encode=dup), "bad_record")
    b.neg("unknown-field", "an extra key", "record", _raw_record(base | {"zone": "x"}, 1), "bad_record")
    b.neg(
        "missing-field",
        "no capabilities",
        "record",
        _raw_record({k: v for k, v in base.items() if k != "capabilities"}, 1),
        "bad_record",
    )
    b.neg(
        "big-integer", "seq = 2**53", "record", _raw_record(base | {"seq": MAX_SAFE_INT + 1}, 1), "bad_record"
    )
    b.neg("string-integer", "seq as a string", "record", _raw_record(base | {"seq": "7"}, 1), "bad_record")
    flt = canonical_json(base).replace(b'"seq":7', b'"seq":7.0')
    b.neg("float", "seq = 7.0", "record", _raw_record(base, 1, encode=flt), "bad_record")
    b.neg(
        "null-digest",
        "next_key_digest null",
        "record",
        _raw_record(base | {"next_key_digest": None}, 1),
        "bad_record",
    )
    b.neg(
        "uppercase-alias",
        "alias Planner",
        "record",
        _raw_record(base | {"aliases": ["Planner"]}, 1),
        "bad_record",
    )
    b.neg(
        "alias-hyphen",
        "label starts with a hyphen",
        "record",
        _raw_record(base | {"aliases": ["-a"]}, 1),
        "bad_record",
    )
    b.neg(
        "unsorted-aliases",
        "aliases out of order",
        "record",
        _raw_record(base | {"aliases": ["z", "a"]}, 1),
        "bad_record",
    )
    b.neg(
        "repeated-capability",
        "plan twice",
        "record",
        _raw_record(base | {"capabilities": ["plan", "plan"]}, 1),
        "bad_record",
    )
    b.neg(
        "http-address",
        "scheme http",
        "record",
        _raw_record(base | {"addresses": ["http://a:1"]}, 1),
        "bad_record",
    )
    b.neg(
        "non-ascii",
        "a non-ASCII alias, escaped",
        "record",
        _raw_record(base | {"aliases": ["caf\u00e9"]}, 1),
        "bad_record",
    )
    b.neg(
        "uppercase-agent-id",
        "agent_id in uppercase",
        "record",
        _raw_record(base | {"agent_id": alice.agent_id.upper()}, 1),
        "invalid_agent_id",
    )

    # a key that is not an AgentId, with a signature that a signature check alone accepts: the first
    # seq whose challenge lets the forgery (small-order key) or the torsion signature (mixed order) pass
    def keyed(agent_id: str) -> Callable[[int], bytes]:
        return lambda seq: signing_input(
            Domain.RECORD, canonical_json(base | {"agent_id": agent_id, "seq": seq})
        )

    prefix = len(Domain.RECORD.value) + 1
    order_8 = points.encode(points.ORDER_8).hex()
    small_data, small_sig, _ = points.forge_small_order(bytes.fromhex(order_8), keyed(order_8))
    b.neg(
        "small-order-agent-id",
        "agent_id is a point of order 8; signature R = identity, S = 0 (a plain cofactorless check "
        "accepts it)",
        "record",
        {"data": small_data[prefix:].decode("ascii"), "signature_hex": small_sig.hex()},
        "invalid_agent_id",
    )
    _, mixed_data, mixed_sig, _ = points.sign_mixed_order(_seed(1), lambda seq, aid: keyed(aid)(seq))
    b.neg(
        "mixed-order-agent-id",
        "agent_id is seed 1's key plus a point of order 8; the signature by seed 1's scalar verifies "
        "under libsodium's signature check",
        "record",
        {"data": mixed_data[prefix:].decode("ascii"), "signature_hex": mixed_sig.hex()},
        "invalid_agent_id",
    )

    # --- negative statements
    thief = sign_rotation(alice, mallory, seq=8, issued_us=now)
    b.neg(
        "rotation-uncommitted",
        "seed 1 rotates to seed 3 though it committed to seed 2 (a thief of the current key)",
        "rotation",
        {
            "data": thief.data.decode("ascii"),
            "old_signature_hex": thief.old_signature.hex(),
            "new_signature_hex": thief.new_signature.hex(),
        },
        "uncommitted_successor",
        next_key_digest=key_digest(alice_next.agent_id),
    )
    b.neg(
        "rotation-no-countersignature",
        "new_signature made by the old key",
        "rotation",
        {
            "data": rot.data.decode("ascii"),
            "old_signature_hex": rot.old_signature.hex(),
            "new_signature_hex": rot.old_signature.hex(),
        },
        "bad_signature",
        next_key_digest=None,
    )
    b.neg(
        "rotation-wrong-domain",
        "both signatures in iac-record-v1",
        "rotation",
        {
            "data": rot.data.decode("ascii"),
            "old_signature_hex": alice.sign(Domain.RECORD, rot.data).hex(),
            "new_signature_hex": alice_next.sign(Domain.RECORD, rot.data).hex(),
        },
        "bad_signature",
        next_key_digest=None,
    )
    b.neg(
        "revocation-wrong-signer",
        "signed by seed 2",
        "revocation",
        {"data": rev.data.decode("ascii"), "signature_hex": alice_next.sign(Domain.REVOKE, rev.data).hex()},
        "bad_signature",
    )
    future = Revocation(alice.agent_id, 9, now + 3_600_000_000).encode()
    b.neg(
        "revocation-future",
        "issued an hour after now (max skew 60 s)",
        "revocation",
        {"data": future.decode("ascii"), "signature_hex": alice.sign(Domain.REVOKE, future).hex()},
        "bad_record",
    )

    return {
        "version": VECTORS_VERSION,
        "description": (
            "IAC registry payloads: canonical JSON (RFC 8785 on a printable-ASCII, integer-only subset), "
            "signed as DOMAIN || 0x00 || canonical bytes. Negative vectors name the error of open_record / "
            "open_rotation / open_revocation at now_us."
        ),
        "now_us": now,
        "records": b.records,
        "rotations": b.rotations,
        "revocations": b.revocations,
        "negative": b.negative,
    }


def dump_vectors() -> str:
    """The text of ``proto/testvectors/records-v1.json``."""
    return render(make_vectors(), ascii_only=True)


def check_negative_vector(vector: dict[str, Any]) -> None:
    """Run one negative vector through the opener of its kind (raises the error it names)."""
    data = vector["data"].encode("ascii")
    now = vector["now_us"]
    if vector["kind"] == "record":
        open_record(data, bytes.fromhex(vector["signature_hex"]), now)
    elif vector["kind"] == "rotation":
        signed = SignedRotation(
            data, bytes.fromhex(vector["old_signature_hex"]), bytes.fromhex(vector["new_signature_hex"])
        )
        open_rotation(signed, now, next_key_digest=vector["next_key_digest"])
    elif vector["kind"] == "revocation":
        open_revocation(SignedRevocation(data, bytes.fromhex(vector["signature_hex"])), now)
    else:
        raise ConfigError(f"unknown vector kind {vector['kind']!r}")


def write_record_vectors(path: str | Path = VECTOR_FILE) -> None:
    """Rewrite the vector file (``python -m tools.vectors.records``)."""
    write(path, dump_vectors())


if __name__ == "__main__":
    write_record_vectors()
