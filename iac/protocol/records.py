"""Signed agent records (sans-IO: time is an argument).

An agent publishes an :class:`AgentRecord` (its AgentId, aliases, addresses,
capabilities, an expiry, a ``seq`` that only grows and optionally the SHA-256 of
its successor's public key) signed in domain ``iac-record-v1``, encoded as
canonical JSON (:mod:`iac.protocol.canonical`). Rotation and revocation
statements are in :mod:`iac.protocol.statements`; their names are importable from
here too.

Nothing here knows about a registry: :mod:`iac.protocol.registry` keeps the state
(stored ``seq``, committed successors, which key is rotated or revoked).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iac.errors import ConfigError, MessageRejected
from iac.protocol.canonical import (
    HEX64_RE,
    MAX_SAFE_INT,  # re-exported for importers not yet updated
    SignedPayload,
    as_bad_record,
    bad_record,
    canonical_json,
    check_fields,
    check_int,
    parse_canonical,
    signature_bytes,
    str_field,
)
from iac.protocol.statements import (  # re-exported for importers not yet updated
    DEFAULT_STATEMENT_SKEW_US,
    MAX_REASON_LEN,
    MAX_STATEMENT_SIZE,
    Revocation,
    RotationStatement,
    SignedRevocation,
    SignedRotation,
    check_successor,
    decode_revocation,
    decode_rotation,
    key_digest,
    open_revocation,
    open_rotation,
    sign_revocation,
    sign_rotation,
)
from iac.wire.identity import Domain, Identity, is_agent_id, verify

# --- limits and formats ------------------------------------------------------------------------

#: Hard protocol limits; a registry may configure lower ones.
MAX_RECORD_SIZE = 16 * 1024
MAX_ALIASES = 32
MAX_ADDRESSES = 16
MAX_CAPABILITIES = 64
MAX_ALIAS_LEN = 253
MAX_ADDRESS_LEN = 256
MAX_CAPABILITY_LEN = 64
#: Candidates per record (docs/PROTOCOL.md, "Through NATs"): a signature does not make an address
#: honest, so a record cannot point punching at more than this many addresses.
MAX_CANDIDATES = 8
#: Kinds of candidate: an address the node listens on, an address a peer observed it at (its NAT's
#: mapping), a relay (an AgentId) it can be reached through.
CANDIDATE_KINDS = ("local", "observed", "relay")

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_ALIAS_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9._:/-]{0,63}")
_HOST_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*|\[[0-9a-f:.]{{2,45}}\]")
_NET_ADDRESS_RE = re.compile(r"(quic|tls)://([^:/\[\]]+|\[[^\]]*\]):([1-9][0-9]{0,4})")
_UNIX_ADDRESS_RE = re.compile(r"unix:///[\x21-\x7e]*")


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


def is_private_address(value: str) -> bool:
    """True for a ``quic://``/``tls://`` address whose host is a private, loopback, link-local
    or unspecified IP literal (a LAN address; host names are not private)."""
    m = _NET_ADDRESS_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        return False
    try:
        ip = ipaddress.ip_address(m.group(2).strip("[]"))
    except ValueError:
        return False
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified


def is_ip_literal(host: str) -> bool:
    """True for an IPv4 or IPv6 address literal (brackets allowed): a host that needs no name
    lookup, so sending to it never blocks."""
    if not isinstance(host, str):
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def is_ip_address(value: str) -> bool:
    """True for a ``quic://``/``tls://`` address whose host is an IP literal (not a host name)."""
    m = _NET_ADDRESS_RE.fullmatch(value) if isinstance(value, str) else None
    return m is not None and is_address(value) and is_ip_literal(m.group(2))


def _check_candidate(kind: Any, value: Any, exc: Callable[[str], Exception]) -> None:
    if kind not in CANDIDATE_KINDS:
        raise exc(f"candidate kind must be one of {', '.join(CANDIDATE_KINDS)}: {kind!r:.40}")
    if kind == "relay":
        if not isinstance(value, str) or not is_agent_id(value):
            raise exc(f"a relay candidate names an AgentId: {value!r:.80}")
    elif not isinstance(value, str) or not is_address(value) or value.startswith("unix:"):
        raise exc(f"a {kind} candidate is a quic:// or tls:// address: {value!r:.80}")


def _check_unique(name: str, values: tuple[str, ...], exc: Callable[[str], Exception]) -> None:
    if len(set(values)) != len(values):
        raise exc(f"{name} contains a repeated value")


def _str_list(obj: dict[str, Any], key: str, limit: int) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MessageRejected(f"{key} must be an array of strings", reason="bad_record")
    if len(value) > limit:
        raise MessageRejected(
            f"{key} has {len(value)} entries, over the limit of {limit}", reason="bad_record"
        )
    return tuple(value)


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """What an agent tells the registry about itself. Validated on construction.

    ``aliases`` and ``capabilities`` are sets: they are stored sorted (the
    constructor sorts them) and may not repeat. ``addresses`` keep their order
    (the agent's preference) and may not repeat. A bad field raises
    :class:`~iac.ConfigError`; the same fault in received bytes is ``bad_record``.
    """

    agent_id: str
    seq: int
    expires_us: int
    aliases: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    #: lowercase hex SHA-256 of the successor's 32-byte public key (see :func:`key_digest`)
    next_key_digest: str | None = None
    #: ``(kind, value)`` pairs, in preference order: ``("local", url)``, ``("observed", url)``,
    #: ``("relay", agent_id)`` (docs/PROTOCOL.md, "Through NATs"); at most :data:`MAX_CANDIDATES`.
    candidates: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not is_agent_id(self.agent_id):
            raise ConfigError(f"agent_id is not an AgentId: {self.agent_id!r:.80}")
        check_int("seq", self.seq, ConfigError)
        check_int("expires_us", self.expires_us, ConfigError)
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
            not isinstance(self.next_key_digest, str) or HEX64_RE.fullmatch(self.next_key_digest) is None
        ):
            raise ConfigError("next_key_digest must be 64 lowercase hex characters (SHA-256)")
        candidates = tuple((kind, value) for kind, value in self.candidates)
        object.__setattr__(self, "candidates", candidates)
        if len(candidates) > MAX_CANDIDATES:
            raise ConfigError(f"candidates: {len(candidates)} entries, over the limit of {MAX_CANDIDATES}")
        _check_unique("candidates", tuple(f"{k} {v}" for k, v in candidates), ConfigError)
        for kind, value in candidates:
            _check_candidate(kind, value, ConfigError)

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
        if self.candidates:  # left out when empty: a record without candidates reads as before
            obj["candidates"] = [{"kind": k, "value": v} for k, v in self.candidates]
        return obj

    def encode(self) -> bytes:
        """The canonical bytes that :func:`sign_record` signs."""
        return canonical_json(self.to_json_obj())


_RECORD_REQUIRED = frozenset({"addresses", "agent_id", "aliases", "capabilities", "expires_us", "seq"})
_RECORD_OPTIONAL = frozenset({"next_key_digest", "candidates"})


def _candidates(obj: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    value = obj.get("candidates", [])
    if "candidates" in obj and (not isinstance(value, list) or not value):
        raise MessageRejected(
            "candidates must be a non-empty array (left out when there are none)", reason="bad_record"
        )
    if len(value) > MAX_CANDIDATES:
        raise MessageRejected(
            f"candidates has {len(value)} entries, over the limit of {MAX_CANDIDATES}", reason="bad_record"
        )
    out: list[tuple[str, str]] = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"kind", "value"}:
            raise MessageRejected('a candidate is {"kind": ..., "value": ...}', reason="bad_record")
        _check_candidate(item["kind"], item["value"], bad_record)
        out.append((item["kind"], item["value"]))
    return tuple(out)


def decode_record(data: bytes, *, max_size: int = MAX_RECORD_SIZE) -> AgentRecord:
    """Parse canonical record bytes and check the schema. Does **not** check the signature."""
    obj = parse_canonical(data, max_size)
    check_fields(obj, _RECORD_REQUIRED, _RECORD_OPTIONAL, "record")
    agent_id = str_field(obj, "agent_id")
    if not is_agent_id(agent_id):
        raise MessageRejected(
            f"record agent_id is not an AgentId: {agent_id!r:.80}", reason="invalid_agent_id"
        )
    digest = obj.get("next_key_digest")
    if "next_key_digest" in obj and not isinstance(digest, str):
        raise MessageRejected(
            "next_key_digest must be a string (left out when there is none)", reason="bad_record"
        )
    try:
        record = AgentRecord(
            agent_id=agent_id,
            seq=check_int("seq", obj["seq"], bad_record),
            expires_us=check_int("expires_us", obj["expires_us"], bad_record),
            aliases=_str_list(obj, "aliases", MAX_ALIASES),
            addresses=_str_list(obj, "addresses", MAX_ADDRESSES),
            capabilities=_str_list(obj, "capabilities", MAX_CAPABILITIES),
            next_key_digest=digest,
            candidates=_candidates(obj),
        )
    except ConfigError as exc:
        raise as_bad_record(exc) from None
    if record.encode() != bytes(data):
        raise MessageRejected("aliases and capabilities must be sorted arrays", reason="bad_record")
    return record


@dataclass(frozen=True, slots=True)
class SignedRecord(SignedPayload):
    """Canonical record bytes and the 64-byte ``iac-record-v1`` signature by ``agent_id``
    (envelope key ``record``)."""

    KEY = "record"


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

    Order: size, canonical JSON and schema (``bad_record``,
    ``invalid_agent_id``), expiry (``record_expired`` unless
    ``expires_us > now_us``), signature by ``agent_id`` in ``iac-record-v1``
    (``bad_signature``). Whether ``seq`` is new is the registry's check.
    """
    record = decode_record(data, max_size=max_size)
    if record.expires_us <= now_us:
        raise MessageRejected(
            f"record of {record.agent_id[:16]}… expired at {record.expires_us}", reason="record_expired"
        )
    verify(record.agent_id, Domain.RECORD, bytes(data), signature_bytes(signature, "record signature"))
    return record


__all__ = [
    "CANDIDATE_KINDS",
    "DEFAULT_STATEMENT_SKEW_US",
    "MAX_ADDRESSES",
    "MAX_ADDRESS_LEN",
    "MAX_ALIASES",
    "MAX_ALIAS_LEN",
    "MAX_CANDIDATES",
    "MAX_CAPABILITIES",
    "MAX_CAPABILITY_LEN",
    "MAX_REASON_LEN",
    "MAX_RECORD_SIZE",
    "MAX_SAFE_INT",
    "MAX_STATEMENT_SIZE",
    "AgentRecord",
    "Revocation",
    "RotationStatement",
    "SignedRecord",
    "SignedRevocation",
    "SignedRotation",
    "canonical_json",
    "check_successor",
    "decode_record",
    "decode_revocation",
    "decode_rotation",
    "is_address",
    "is_alias",
    "is_capability",
    "is_ip_address",
    "is_ip_literal",
    "is_private_address",
    "key_digest",
    "open_record",
    "open_revocation",
    "open_rotation",
    "parse_canonical",
    "sign_record",
    "sign_revocation",
    "sign_rotation",
]
