"""Signed agent records, rotation and revocation statements (sans-IO: time is an argument).

An agent publishes an :class:`AgentRecord` (its AgentId, aliases, addresses,
capabilities, an expiry, a ``seq`` that only grows and optionally the SHA-256 of
its successor's public key) signed in domain ``iac-record-v1``. A key names its
successor in a :class:`RotationStatement` (domain ``iac-rotate-v1``) signed by
the old key *and* countersigned by the new one, and ends itself with a
:class:`Revocation` (domain ``iac-revoke-v1``).

**Canonical encoding.** Every payload is one JSON object encoded as RFC 8785
(JCS) would encode it: keys sorted, no whitespace, UTF-8. The schemas keep to a
subset on which every JSON library agrees: every string is printable ASCII
(0x20–0x7E, where only ``"`` and ``\\`` are escaped, as ``\\"`` and ``\\\\``), every
number is an integer in ``[0, 2**53 - 1]`` written as plain digits (no strings
for u64, no floats, no exponents), absent optional fields are left out (never
``null``), and sets (aliases, capabilities) are sorted arrays without repeats.
On that subset ``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` is
JCS. The signature covers those exact bytes; a verifier parses them, re-encodes
and refuses the payload unless it gets the same bytes back, so duplicate keys,
whitespace, unsorted keys or another spelling of a number never verify.

Nothing here knows about a registry: :mod:`iac.protocol.registry` keeps the state
(stored ``seq``, committed successors, which key is rotated or revoked).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from iac.errors import (
    BadRecord,
    ConfigError,
    InvalidAgentId,
    RecordExpired,
    UncommittedSuccessor,
)
from iac.wire.identity import Domain, Identity, check_agent_id, is_agent_id, verify

# --- limits and formats ------------------------------------------------------------------------

#: Largest integer in any payload (2**53 - 1: exact in every JSON implementation).
MAX_SAFE_INT = (1 << 53) - 1
#: Hard protocol limits; a registry may configure lower ones.
MAX_RECORD_SIZE = 16 * 1024
MAX_ALIASES = 32
MAX_ADDRESSES = 16
MAX_CAPABILITIES = 64
MAX_ALIAS_LEN = 253
MAX_ADDRESS_LEN = 256
MAX_CAPABILITY_LEN = 64
MAX_REASON_LEN = 256
#: Largest statement (rotation or revocation) in bytes.
MAX_STATEMENT_SIZE = 1024
#: How far in the future a statement's ``issued_us`` may be (clock skew), by default.
DEFAULT_STATEMENT_SKEW_US = 60_000_000

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_ALIAS_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9._:/-]{0,63}")
_HOST_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*|\[[0-9a-f:.]{{2,45}}\]")
_NET_ADDRESS_RE = re.compile(r"(quic|tls)://([^:/\[\]]+|\[[^\]]*\]):([1-9][0-9]{0,4})")
_UNIX_ADDRESS_RE = re.compile(r"unix:///[\x21-\x7e]*")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_PRINTABLE_RE = re.compile(r"[\x20-\x7e]*")


def is_alias(value: str) -> bool:
    """True for a DNS-like name: lowercase labels of ``[a-z0-9-]`` (1–63, no leading or trailing
    hyphen) joined by single dots, at most 253 characters."""
    return isinstance(value, str) and len(value) <= MAX_ALIAS_LEN and _ALIAS_RE.fullmatch(value) is not None


def is_capability(value: str) -> bool:
    """True for 1–64 characters of ``[a-z0-9._:/-]`` starting with a letter or digit."""
    return isinstance(value, str) and _CAPABILITY_RE.fullmatch(value) is not None


def is_address(value: str) -> bool:
    """True for ``quic://host:port``, ``tls://host:port`` (lowercase host name, IPv4 or
    ``[IPv6]``, port 1–65535 without leading zeros) or ``unix:///absolute/path``."""
    if not isinstance(value, str) or len(value) > MAX_ADDRESS_LEN:
        return False
    if value.startswith("unix://"):
        return _UNIX_ADDRESS_RE.fullmatch(value) is not None and '"' not in value and "\\" not in value
    m = _NET_ADDRESS_RE.fullmatch(value)
    return m is not None and _HOST_RE.fullmatch(m.group(2)) is not None and int(m.group(3)) <= 65535


def key_digest(agent_id: str) -> str:
    """The commitment to a key: lowercase hex SHA-256 of the 32 raw public-key bytes."""
    return hashlib.sha256(bytes.fromhex(check_agent_id(agent_id))).hexdigest()


def _check_int(name: str, value: object, exc: type[Exception]) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INT:
        raise exc(f"{name} must be an integer in [0, 2**53 - 1], got {value!r:.40}")
    return value


def _check_unique(name: str, values: tuple[str, ...], exc: type[Exception]) -> None:
    if len(set(values)) != len(values):
        raise exc(f"{name} contains a repeated value")


# --- canonical JSON --------------------------------------------------------------------------


def canonical_json(obj: dict[str, Any]) -> bytes:
    """The canonical bytes of a payload object (see the module docstring)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BadRecord(f"duplicate key {key!r:.40}")
        out[key] = value
    return out


def _reject_constant(value: str) -> Any:
    raise BadRecord(f"{value} is not allowed")


def _reject_float(value: str) -> Any:
    raise BadRecord(f"only integers are allowed, got {value!r:.40}")


def parse_canonical(data: bytes, max_size: int) -> dict[str, Any]:
    """Parse a payload and insist that it is exactly its own canonical encoding.

    Raises :class:`BadRecord` for anything else: too large, not UTF-8 ASCII JSON,
    not an object, duplicate keys, floats, NaN, non-ASCII or control characters,
    whitespace, unsorted keys.
    """
    if len(data) > max_size:
        raise BadRecord(f"payload is {len(data)} bytes, over the limit of {max_size}")
    try:
        text = bytes(data).decode("ascii")
        obj = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_reject_float,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, BadRecord):
            raise
        raise BadRecord(f"payload is not ASCII JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRecord("payload is not a JSON object")
    if not _strings_printable(obj):
        raise BadRecord("payload strings must be printable ASCII (0x20-0x7E)")
    if canonical_json(obj) != bytes(data):
        raise BadRecord("payload is not in canonical form (sorted keys, no whitespace, minimal escapes)")
    return obj


def _strings_printable(value: object, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(value, str):
        return _PRINTABLE_RE.fullmatch(value) is not None
    if isinstance(value, dict):
        return all(
            _strings_printable(k, depth + 1) and _strings_printable(v, depth + 1) for k, v in value.items()
        )
    if isinstance(value, list):
        return all(_strings_printable(v, depth + 1) for v in value)
    return True


def _fields(obj: dict[str, Any], required: frozenset[str], optional: frozenset[str], what: str) -> None:
    keys = set(obj)
    missing = required - keys
    if missing:
        raise BadRecord(f"{what} is missing {sorted(missing)}")
    unknown = keys - required - optional
    if unknown:
        raise BadRecord(f"{what} has unknown fields {sorted(unknown)[:4]}")


def _str_list(obj: dict[str, Any], key: str, limit: int) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRecord(f"{key} must be an array of strings")
    if len(value) > limit:
        raise BadRecord(f"{key} has {len(value)} entries, over the limit of {limit}")
    return tuple(value)


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise BadRecord(f"{key} must be a string")
    return value


def _sig(signature: bytes, what: str) -> bytes:
    if not isinstance(signature, bytes | bytearray) or len(signature) != 64:
        raise BadRecord(f"{what} must be 64 bytes")
    return bytes(signature)


def _local(exc: Exception) -> BadRecord:
    return BadRecord(str(exc))


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """What an agent tells the registry about itself. Validated on construction.

    ``aliases`` and ``capabilities`` are sets: they are stored sorted (the
    constructor sorts them) and may not repeat. ``addresses`` keep their order
    (the agent's preference) and may not repeat. A bad field raises
    :class:`~iac.ConfigError`; the same fault in received bytes is :class:`BadRecord`.
    """

    agent_id: str
    seq: int
    expires_us: int
    aliases: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    #: lowercase hex SHA-256 of the successor's 32-byte public key (see :func:`key_digest`)
    next_key_digest: str | None = None

    def __post_init__(self) -> None:
        if not is_agent_id(self.agent_id):
            raise ConfigError(f"agent_id is not an AgentId: {self.agent_id!r:.80}")
        _check_int("seq", self.seq, ConfigError)
        _check_int("expires_us", self.expires_us, ConfigError)
        aliases = tuple(sorted(self.aliases))
        capabilities = tuple(sorted(self.capabilities))
        addresses = tuple(self.addresses)
        object.__setattr__(self, "aliases", aliases)
        object.__setattr__(self, "capabilities", capabilities)
        object.__setattr__(self, "addresses", addresses)
        for name, values, limit in (
            ("aliases", aliases, MAX_ALIASES),
            ("addresses", addresses, MAX_ADDRESSES),
            ("capabilities", capabilities, MAX_CAPABILITIES),
        ):
            if len(values) > limit:
                raise ConfigError(f"{name}: {len(values)} entries, over the limit of {limit}")
            _check_unique(name, values, ConfigError)
        for alias in aliases:
            if not is_alias(alias):
                raise ConfigError(f"not an alias (lowercase DNS-like name): {alias!r:.80}")
        for address in addresses:
            if not is_address(address):
                raise ConfigError(f"not an address (quic://h:p, tls://h:p, unix:///path): {address!r:.80}")
        for capability in capabilities:
            if not is_capability(capability):
                raise ConfigError(f"not a capability ([a-z0-9._:/-], 1-64 chars): {capability!r:.80}")
        if self.next_key_digest is not None and (
            not isinstance(self.next_key_digest, str) or _DIGEST_RE.fullmatch(self.next_key_digest) is None
        ):
            raise ConfigError("next_key_digest must be 64 lowercase hex characters (SHA-256)")

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "addresses": list(self.addresses),
            "agent_id": self.agent_id,
            "aliases": list(self.aliases),
            "capabilities": list(self.capabilities),
            "expires_us": self.expires_us,
            "seq": self.seq,
        }
        if self.next_key_digest is not None:
            obj["next_key_digest"] = self.next_key_digest
        return obj

    def encode(self) -> bytes:
        """The canonical bytes that :func:`sign_record` signs."""
        return canonical_json(self.to_json_obj())


_RECORD_REQUIRED = frozenset({"addresses", "agent_id", "aliases", "capabilities", "expires_us", "seq"})
_RECORD_OPTIONAL = frozenset({"next_key_digest"})


def decode_record(data: bytes, *, max_size: int = MAX_RECORD_SIZE) -> AgentRecord:
    """Parse canonical record bytes and check the schema. Does **not** check the signature."""
    obj = parse_canonical(data, max_size)
    _fields(obj, _RECORD_REQUIRED, _RECORD_OPTIONAL, "record")
    agent_id = _str(obj, "agent_id")
    if not is_agent_id(agent_id):
        raise InvalidAgentId(f"record agent_id is not an AgentId: {agent_id!r:.80}")
    digest = obj.get("next_key_digest")
    if "next_key_digest" in obj and not isinstance(digest, str):
        raise BadRecord("next_key_digest must be a string (left out when there is none)")
    try:
        record = AgentRecord(
            agent_id=agent_id,
            seq=_check_int("seq", obj["seq"], BadRecord),
            expires_us=_check_int("expires_us", obj["expires_us"], BadRecord),
            aliases=_str_list(obj, "aliases", MAX_ALIASES),
            addresses=_str_list(obj, "addresses", MAX_ADDRESSES),
            capabilities=_str_list(obj, "capabilities", MAX_CAPABILITIES),
            next_key_digest=digest,
        )
    except ConfigError as exc:
        raise _local(exc) from None
    if record.encode() != bytes(data):
        raise BadRecord("aliases and capabilities must be sorted arrays")
    return record


@dataclass(frozen=True, slots=True)
class SignedRecord:
    """Canonical record bytes and the 64-byte ``iac-record-v1`` signature by ``agent_id``."""

    data: bytes
    signature: bytes

    def to_json_obj(self) -> dict[str, str]:
        """Envelope for a JSON payload: the record as a string (its exact bytes) and the signature."""
        return {"record": self.data.decode("ascii"), "signature": self.signature.hex()}

    @classmethod
    def from_json_obj(cls, obj: object) -> SignedRecord:
        """Read the envelope of :meth:`to_json_obj`; :class:`BadRecord` if malformed."""
        record, signature = _envelope(obj, "record", ("signature",))
        return cls(record, signature[0])


def _envelope(obj: object, body_key: str, sig_keys: tuple[str, ...]) -> tuple[bytes, list[bytes]]:
    if not isinstance(obj, dict) or set(obj) != {body_key, *sig_keys}:
        raise BadRecord(f"envelope must have exactly the keys {sorted({body_key, *sig_keys})}")
    body = obj[body_key]
    if not isinstance(body, str) or not body.isascii():
        raise BadRecord(f"envelope {body_key} must be an ASCII string")
    sigs: list[bytes] = []
    for key in sig_keys:
        value = obj[key]
        if not isinstance(value, str) or _SIG_HEX_RE.fullmatch(value) is None:
            raise BadRecord(f"envelope {key} must be 128 lowercase hex characters")
        sigs.append(bytes.fromhex(value))
    return body.encode("ascii"), sigs


_SIG_HEX_RE = re.compile(r"[0-9a-f]{128}")


def sign_record(identity: Identity, record: AgentRecord) -> SignedRecord:
    """Encode ``record`` canonically and sign it with ``Domain.RECORD``."""
    if identity.agent_id != record.agent_id:
        raise ConfigError("a record must be signed by the key it describes")
    data = record.encode()
    if len(data) > MAX_RECORD_SIZE:
        raise ConfigError(f"record is {len(data)} bytes, over the limit of {MAX_RECORD_SIZE}")
    return SignedRecord(data, identity.sign(Domain.RECORD, data))


def open_record(
    data: bytes, signature: bytes, now_us: int, *, max_size: int = MAX_RECORD_SIZE
) -> AgentRecord:
    """Verify a signed record and return it.

    Order: size, canonical JSON and schema (:class:`BadRecord`,
    :class:`~iac.InvalidAgentId`), expiry (:class:`RecordExpired` unless
    ``expires_us > now_us``), signature by ``agent_id`` in ``iac-record-v1``
    (:class:`~iac.BadSignature`). Whether ``seq`` is new is the registry's check.
    """
    record = decode_record(data, max_size=max_size)
    if record.expires_us <= now_us:
        raise RecordExpired(f"record of {record.agent_id[:16]}… expired at {record.expires_us}")
    verify(record.agent_id, Domain.RECORD, bytes(data), _sig(signature, "record signature"))
    return record


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
        _check_int("seq", self.seq, ConfigError)
        _check_int("issued_us", self.issued_us, ConfigError)

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
        data, sigs = _envelope(obj, "rotation", ("old_signature", "new_signature"))
        return cls(data, sigs[0], sigs[1])


def sign_rotation(old: Identity, new: Identity, *, seq: int, issued_us: int) -> SignedRotation:
    """The statement ``old -> new``, signed by ``old`` and countersigned by ``new``."""
    data = RotationStatement(old.agent_id, new.agent_id, seq, issued_us).encode()
    return SignedRotation(data, old.sign(Domain.ROTATE, data), new.sign(Domain.ROTATE, data))


_ROTATION_FIELDS = frozenset({"issued_us", "new_agent_id", "old_agent_id", "seq"})


def decode_rotation(data: bytes) -> RotationStatement:
    """Parse canonical statement bytes and check the schema. Does **not** check signatures."""
    obj = parse_canonical(data, MAX_STATEMENT_SIZE)
    _fields(obj, _ROTATION_FIELDS, frozenset(), "rotation")
    old, new = _str(obj, "old_agent_id"), _str(obj, "new_agent_id")
    check_agent_id(old)
    check_agent_id(new)
    try:
        return RotationStatement(
            old,
            new,
            _check_int("seq", obj["seq"], BadRecord),
            _check_int("issued_us", obj["issued_us"], BadRecord),
        )
    except ConfigError as exc:
        raise _local(exc) from None


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
    Checks: schema (:class:`BadRecord`), ``issued_us`` not more than
    ``max_skew_us`` in the future (:class:`BadRecord`), the successor's digest
    (:class:`UncommittedSuccessor`), the old key's signature and the new key's
    countersignature (:class:`~iac.BadSignature`). ``seq`` against the stored
    state is the caller's check.
    """
    statement = decode_rotation(signed.data)
    if statement.issued_us > now_us + max_skew_us:
        raise BadRecord("rotation issued in the future")
    check_successor(statement, next_key_digest)
    verify(statement.old_agent_id, Domain.ROTATE, signed.data, _sig(signed.old_signature, "old signature"))
    verify(statement.new_agent_id, Domain.ROTATE, signed.data, _sig(signed.new_signature, "new signature"))
    return statement


def check_successor(statement: RotationStatement, next_key_digest: str | None) -> None:
    """Raise :class:`UncommittedSuccessor` unless the successor matches the commitment (if any)."""
    if next_key_digest is not None and key_digest(statement.new_agent_id) != next_key_digest:
        raise UncommittedSuccessor(
            f"{statement.old_agent_id[:16]}… committed to a successor other than "
            f"{statement.new_agent_id[:16]}…"
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
        _check_int("seq", self.seq, ConfigError)
        _check_int("issued_us", self.issued_us, ConfigError)
        if (
            not isinstance(self.reason, str)
            or len(self.reason) > MAX_REASON_LEN
            or _PRINTABLE_RE.fullmatch(self.reason) is None
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
class SignedRevocation:
    """Canonical revocation bytes and the revoked key's signature."""

    data: bytes
    signature: bytes

    def to_json_obj(self) -> dict[str, str]:
        return {"revocation": self.data.decode("ascii"), "signature": self.signature.hex()}

    @classmethod
    def from_json_obj(cls, obj: object) -> SignedRevocation:
        data, sigs = _envelope(obj, "revocation", ("signature",))
        return cls(data, sigs[0])


def sign_revocation(identity: Identity, *, seq: int, issued_us: int, reason: str = "") -> SignedRevocation:
    data = Revocation(identity.agent_id, seq, issued_us, reason).encode()
    return SignedRevocation(data, identity.sign(Domain.REVOKE, data))


_REVOCATION_FIELDS = frozenset({"agent_id", "issued_us", "reason", "seq"})


def decode_revocation(data: bytes) -> Revocation:
    obj = parse_canonical(data, MAX_STATEMENT_SIZE)
    _fields(obj, _REVOCATION_FIELDS, frozenset(), "revocation")
    agent_id = check_agent_id(_str(obj, "agent_id"))
    try:
        return Revocation(
            agent_id,
            _check_int("seq", obj["seq"], BadRecord),
            _check_int("issued_us", obj["issued_us"], BadRecord),
            _str(obj, "reason"),
        )
    except ConfigError as exc:
        raise _local(exc) from None


def open_revocation(
    signed: SignedRevocation, now_us: int, *, max_skew_us: int = DEFAULT_STATEMENT_SKEW_US
) -> Revocation:
    """Verify a revocation: schema, not issued in the future, signature by the revoked key."""
    revocation = decode_revocation(signed.data)
    if revocation.issued_us > now_us + max_skew_us:
        raise BadRecord("revocation issued in the future")
    verify(revocation.agent_id, Domain.REVOKE, signed.data, _sig(signed.signature, "revocation signature"))
    return revocation


# --- test vectors ------------------------------------------------------------------------------

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
    return json.dumps(make_vectors(), indent=1, ensure_ascii=True) + "\n"


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
