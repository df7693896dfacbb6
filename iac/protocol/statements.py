"""Key rotation and revocation statements (sans-IO: time is an argument).

A key names its successor in a :class:`RotationStatement` (domain
``iac-rotate-v1``) signed by the old key *and* countersigned by the new one, and
ends itself with a :class:`Revocation` (domain ``iac-revoke-v1``). Both are
canonical JSON (:mod:`iac.protocol.canonical`). Whether a statement's ``seq`` is
new, and which key is rotated or revoked, is the registry's state
(:mod:`iac.protocol.registry`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from iac.errors import ConfigError, MessageRejected
from iac.protocol.canonical import (
    PRINTABLE_RE,
    SignedPayload,
    as_bad_record,
    bad_record,
    canonical_json,
    check_fields,
    check_int,
    parse_canonical,
    read_envelope,
    signature_bytes,
    str_field,
)
from iac.wire.identity import Domain, Identity, check_agent_id, is_agent_id, verify

MAX_REASON_LEN = 256
#: Largest statement (rotation or revocation) in bytes.
MAX_STATEMENT_SIZE = 1024
#: How far in the future a statement's ``issued_us`` may be (clock skew), by default.
DEFAULT_STATEMENT_SKEW_US = 60_000_000


def key_digest(agent_id: str) -> str:
    """The commitment to a key: lowercase hex SHA-256 of the 32 raw public-key bytes."""
    return hashlib.sha256(bytes.fromhex(check_agent_id(agent_id))).hexdigest()


# --- rotation ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RotationStatement:
    """``old_agent_id`` hands over to ``new_agent_id``; signed by both keys (``iac-rotate-v1``)."""

    old_agent_id: str
    new_agent_id: str
    seq: int
    issued_us: int

    def __post_init__(self) -> None:
        for name in ("old_agent_id", "new_agent_id"):
            if not is_agent_id(getattr(self, name)):
                raise ConfigError(f"{name} is not an AgentId")
        if self.old_agent_id == self.new_agent_id:
            raise ConfigError("a key cannot rotate to itself")
        check_int("seq", self.seq, ConfigError)
        check_int("issued_us", self.issued_us, ConfigError)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "issued_us": self.issued_us,
            "new_agent_id": self.new_agent_id,
            "old_agent_id": self.old_agent_id,
            "seq": self.seq,
        }

    def encode(self) -> bytes:
        return canonical_json(self.to_json_obj())


@dataclass(frozen=True, slots=True)
class SignedRotation:
    """Canonical statement bytes, the old key's signature and the new key's countersignature."""

    data: bytes
    old_signature: bytes
    new_signature: bytes

    def to_json_obj(self) -> dict[str, str]:
        return {
            "new_signature": self.new_signature.hex(),
            "old_signature": self.old_signature.hex(),
            "rotation": self.data.decode("ascii"),
        }

    @classmethod
    def from_json_obj(cls, obj: object) -> SignedRotation:
        data, sigs = read_envelope(obj, "rotation", ("old_signature", "new_signature"))
        return cls(data, sigs[0], sigs[1])


def sign_rotation(old: Identity, new: Identity, *, seq: int, issued_us: int) -> SignedRotation:
    """The statement ``old -> new``, signed by ``old`` and countersigned by ``new``."""
    data = RotationStatement(old.agent_id, new.agent_id, seq, issued_us).encode()
    return SignedRotation(data, old.sign(Domain.ROTATE, data), new.sign(Domain.ROTATE, data))


_ROTATION_FIELDS = frozenset({"issued_us", "new_agent_id", "old_agent_id", "seq"})


def decode_rotation(data: bytes) -> RotationStatement:
    """Parse canonical statement bytes and check the schema. Does **not** check signatures."""
    obj = parse_canonical(data, MAX_STATEMENT_SIZE)
    check_fields(obj, _ROTATION_FIELDS, frozenset(), "rotation")
    old, new = str_field(obj, "old_agent_id"), str_field(obj, "new_agent_id")
    check_agent_id(old)
    check_agent_id(new)
    try:
        return RotationStatement(
            old,
            new,
            check_int("seq", obj["seq"], bad_record),
            check_int("issued_us", obj["issued_us"], bad_record),
        )
    except ConfigError as exc:
        raise as_bad_record(exc) from None


def open_rotation(
    signed: SignedRotation,
    now_us: int,
    *,
    next_key_digest: str | None,
    max_skew_us: int = DEFAULT_STATEMENT_SKEW_US,
) -> RotationStatement:
    """Verify a rotation statement against the old key's committed successor.

    ``next_key_digest`` is what the old key's record committed to (``None`` when
    it committed to nothing; then any successor that countersigns is accepted).
    Checks: schema (``bad_record``), ``issued_us`` not more than
    ``max_skew_us`` in the future (``bad_record``), the successor's digest
    (``uncommitted_successor``), the old key's signature and the new key's
    countersignature (``bad_signature``). ``seq`` against the stored
    state is the caller's check.
    """
    statement = decode_rotation(signed.data)
    if statement.issued_us > now_us + max_skew_us:
        raise MessageRejected("rotation issued in the future", reason="bad_record")
    check_successor(statement, next_key_digest)
    verify(
        statement.old_agent_id,
        Domain.ROTATE,
        signed.data,
        signature_bytes(signed.old_signature, "old signature"),
    )
    verify(
        statement.new_agent_id,
        Domain.ROTATE,
        signed.data,
        signature_bytes(signed.new_signature, "new signature"),
    )
    return statement


def check_successor(statement: RotationStatement, next_key_digest: str | None) -> None:
    """Raise ``uncommitted_successor`` unless the successor matches the commitment (if any)."""
    if next_key_digest is not None and key_digest(statement.new_agent_id) != next_key_digest:
        raise MessageRejected(
            f"{statement.old_agent_id[:16]}… committed to a successor other than "
            f"{statement.new_agent_id[:16]}…",
            reason="uncommitted_successor",
        )


# --- revocation --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Revocation:
    """``agent_id`` ends itself at once; signed by that key (``iac-revoke-v1``)."""

    agent_id: str
    seq: int
    issued_us: int
    reason: str = ""

    def __post_init__(self) -> None:
        if not is_agent_id(self.agent_id):
            raise ConfigError("agent_id is not an AgentId")
        check_int("seq", self.seq, ConfigError)
        check_int("issued_us", self.issued_us, ConfigError)
        if (
            not isinstance(self.reason, str)
            or len(self.reason) > MAX_REASON_LEN
            or PRINTABLE_RE.fullmatch(self.reason) is None
        ):
            raise ConfigError(f"reason must be printable ASCII, at most {MAX_REASON_LEN} characters")

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "issued_us": self.issued_us,
            "reason": self.reason,
            "seq": self.seq,
        }

    def encode(self) -> bytes:
        return canonical_json(self.to_json_obj())


@dataclass(frozen=True, slots=True)
class SignedRevocation(SignedPayload):
    """Canonical revocation bytes and the revoked key's signature (envelope key ``revocation``)."""

    KEY = "revocation"


def sign_revocation(identity: Identity, *, seq: int, issued_us: int, reason: str = "") -> SignedRevocation:
    """Revoke ``identity``'s own key: a statement signed by the key it revokes."""
    data = Revocation(identity.agent_id, seq, issued_us, reason).encode()
    return SignedRevocation(data, identity.sign(Domain.REVOKE, data))


_REVOCATION_FIELDS = frozenset({"agent_id", "issued_us", "reason", "seq"})


def decode_revocation(data: bytes) -> Revocation:
    obj = parse_canonical(data, MAX_STATEMENT_SIZE)
    check_fields(obj, _REVOCATION_FIELDS, frozenset(), "revocation")
    agent_id = check_agent_id(str_field(obj, "agent_id"))
    try:
        return Revocation(
            agent_id,
            check_int("seq", obj["seq"], bad_record),
            check_int("issued_us", obj["issued_us"], bad_record),
            str_field(obj, "reason"),
        )
    except ConfigError as exc:
        raise as_bad_record(exc) from None


def open_revocation(
    signed: SignedRevocation, now_us: int, *, max_skew_us: int = DEFAULT_STATEMENT_SKEW_US
) -> Revocation:
    """Verify a revocation: schema, not issued in the future, signature by the revoked key."""
    revocation = decode_revocation(signed.data)
    if revocation.issued_us > now_us + max_skew_us:
        raise MessageRejected("revocation issued in the future", reason="bad_record")
    verify(
        revocation.agent_id,
        Domain.REVOKE,
        signed.data,
        signature_bytes(signed.signature, "revocation signature"),
    )
    return revocation
