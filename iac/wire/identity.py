"""Agent identity: an Ed25519 key pair whose public key, in hex, is the AgentId.

Every signature is domain-separated (``DOMAIN || 0x00 || data``) so that a
signature made for one role can never be accepted in another.
"""

from __future__ import annotations

import os
import re
import stat
from enum import Enum
from functools import lru_cache
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import nacl.signing

from iac.errors import ConfigError, MessageRejected
from iac.wire.private import write_private

_AGENT_ID_RE = re.compile(r"[0-9a-f]{64}")
_KEY_FILE_TAG = "iac-ed25519-seed-v1"


class Domain(bytes, Enum):
    """Signature domains (docs/PROTOCOL.md, "Identity"). Each role signs under its own tag."""

    MESSAGE = b"iac-msg-v1"
    HELLO_CLIENT = b"iac-hello-client-v1"
    HELLO_SERVER = b"iac-hello-server-v1"
    RECORD = b"iac-record-v1"
    ROTATE = b"iac-rotate-v1"
    REVOKE = b"iac-revoke-v1"


def signing_input(domain: Domain, data: bytes) -> bytes:
    """The exact bytes that are signed: ``DOMAIN || 0x00 || data``."""
    return domain.value + b"\x00" + data


def is_agent_id(value: str) -> bool:
    """True when ``value`` is an AgentId (see :func:`check_agent_id`)."""
    try:
        _key_of(value)
    except MessageRejected:
        return False
    return True


def check_agent_id(value: str) -> str:
    """Return ``value`` if it is an AgentId, else raise ``invalid_agent_id``.

    An AgentId is 64 lowercase hex characters whose 32 bytes are the canonical
    encoding of an Ed25519 point of the prime-order subgroup other than the
    identity (libsodium's ``crypto_core_ed25519_is_valid_point``): small-order
    points, non-canonical encodings (``y >= p``, ``x = 0`` with the sign bit),
    a ``y`` with no curve point and points with a small-order part are refused.
    Every key made by Ed25519 key generation passes.
    """
    _key_of(value)
    return value


@lru_cache(maxsize=4096)
def check_agent_id_cached(value: str) -> str:
    """:func:`check_agent_id` for ids that repeat (the cache keeps only valid ids: a failure raises)."""
    return check_agent_id(value)


def _key_of(value: object) -> bytes:
    """The 32-byte key of an AgentId, else ``invalid_agent_id``."""
    if not isinstance(value, str) or len(value) != 64:  # before the cache hashes a long string
        shown = value[:80] if isinstance(value, str) else type(value).__name__
        raise MessageRejected(
            f"not an AgentId (64 lowercase hex characters): {shown!r}", reason="invalid_agent_id"
        )
    return _public_key(value)


@lru_cache(maxsize=8192)
def _public_key(agent_id: str) -> bytes:
    """:func:`_key_of` for a string of 64 characters.

    Cached, since ids repeat on every message and the point check costs about as
    much as a signature check; only valid ids are kept (a failure raises).
    """
    if _AGENT_ID_RE.fullmatch(agent_id) is None:
        raise MessageRejected(
            f"not an AgentId (64 lowercase hex characters): {agent_id!r}", reason="invalid_agent_id"
        )
    key = bytes.fromhex(agent_id)
    if not nacl.bindings.crypto_core_ed25519_is_valid_point(key):
        raise MessageRejected(
            f"not an AgentId: {agent_id[:16]}… is not a valid Ed25519 public key "
            "(small order, a non-canonical encoding, or not a point of the prime-order subgroup)",
            reason="invalid_agent_id",
        )
    return key


def verify(agent_id: str, domain: Domain, data: bytes, signature: bytes) -> None:
    """Check ``signature`` by ``agent_id`` over ``data`` in ``domain``.

    Raises ``invalid_agent_id`` for an id that :func:`check_agent_id` refuses
    (before the signature is looked at) and ``bad_signature`` for anything
    that libsodium refuses (wrong key, non-canonical signature, small-order ``R``).
    """
    key = _key_of(agent_id)
    if len(signature) != 64:
        raise MessageRejected(f"signature must be 64 bytes, got {len(signature)}", reason="bad_signature")
    try:
        nacl.bindings.crypto_sign_open(b"".join((signature, domain, b"\x00", data)), key)
    except nacl.exceptions.BadSignatureError:
        raise MessageRejected(
            f"signature does not verify for {agent_id[:16]}…", reason="bad_signature"
        ) from None


def verify_signed(agent_id: str, signed: bytes) -> None:
    """Check ``signed`` = ``signature(64) || DOMAIN || 0x00 || data`` by ``agent_id`` (one buffer)."""
    key = _public_key(agent_id) if type(agent_id) is str and len(agent_id) == 64 else _key_of(agent_id)
    try:
        nacl.bindings.crypto_sign_open(signed, key)
    except nacl.exceptions.BadSignatureError:
        raise MessageRejected(
            f"signature does not verify for {agent_id[:16]}…", reason="bad_signature"
        ) from None


class Identity:
    """An agent's secret key. Its repr shows the AgentId, never the secret."""

    __slots__ = ("_agent_id", "_key", "_secret")

    def __init__(self, signing_key: nacl.signing.SigningKey) -> None:
        self._key = signing_key
        self._secret: bytes = signing_key._signing_key  # seed || public key, for the fast path
        self._agent_id = bytes(signing_key.verify_key).hex()

    @classmethod
    def generate(cls) -> Identity:
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte seed (test vectors, derived keys)."""
        if len(seed) != 32:
            raise ConfigError(f"an Ed25519 seed is 32 bytes, got {len(seed)}", reason="key_file_error")
        return cls(nacl.signing.SigningKey(seed))

    @property
    def agent_id(self) -> str:
        return self._agent_id

    @property
    def public_key(self) -> bytes:
        return bytes(self._key.verify_key)

    def sign(self, domain: Domain, data: bytes) -> bytes:
        """Sign ``DOMAIN || 0x00 || data`` and return the 64-byte signature."""
        # A Domain is its bytes (a bytes enum): joined as they are, no ``.value`` lookup.
        signed: bytes = nacl.bindings.crypto_sign(b"".join((domain, b"\x00", data)), self._secret)
        return signed[:64]

    def seed(self) -> bytes:
        """The 32-byte secret seed. Handle with care."""
        return bytes(self._key)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the key to ``path`` with mode 0600 (refuses to replace a file unless asked)."""
        p = Path(path)
        text = (
            f"# IAC agent key. AgentId {self.agent_id}. Keep this file private.\n"
            f"{_KEY_FILE_TAG} {self.seed().hex()}\n"
        )
        try:
            write_private(p, text.encode("ascii"), overwrite=overwrite)
        except FileExistsError:
            raise ConfigError(
                f"{p}: already exists (refusing to overwrite a key)", reason="key_file_error"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"{p}: cannot write key file: {exc.strerror or exc}", reason="key_file_error"
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Load a key file; refuses one that group or others can read."""
        p = Path(path)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise ConfigError(
                f"{p}: no such key file (create one with `iac keygen --out {p}`)", reason="key_file_error"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read key file: {exc.strerror}", reason="key_file_error") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{p}: key file is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"fix with `chmod 600 {p}`",
                reason="key_file_error",
            )
        try:
            text = p.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: cannot read key file: {exc}", reason="key_file_error") from None
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == _KEY_FILE_TAG:
                try:
                    seed = bytes.fromhex(parts[1])
                except ValueError:
                    break
                if len(seed) == 32:
                    return cls.from_seed(seed)
                break
        raise ConfigError(
            f"{p}: not an IAC key file (expected a line '{_KEY_FILE_TAG} <64 hex>')", reason="key_file_error"
        )

    def __repr__(self) -> str:
        return f"Identity(agent_id={self._agent_id!r})"

    def __reduce__(self) -> str | tuple[object, ...]:
        raise TypeError("Identity cannot be pickled (it holds a secret key)")
