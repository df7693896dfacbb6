"""How the gateway authenticates plain A2A callers: a bearer token or an API key, each naming a
principal, declared in the card the gateway publishes (so a2a-sdk's ``AuthInterceptor`` sends
it). Secrets are compared in constant time, by their SHA-256."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from a2a.types import a2a_pb2 as pb

from iac.errors import ConfigError
from iac.integrations.a2a.binding import check_principal

SCHEMES = ("bearer", "apikey")
#: The card's name for the gateway's security scheme.
SCHEME_NAME = "iacGateway"
#: The largest credentials file read, in bytes.
MAX_CREDENTIALS_FILE = 1024 * 1024


@dataclass(frozen=True)
class GatewayAuth:
    """``credentials``: secret -> principal. ``scheme``: ``bearer`` (``Authorization: Bearer
    SECRET``) or ``apikey`` (the secret in header ``header``)."""

    credentials: Mapping[str, str]
    scheme: str = "bearer"
    header: str = "X-API-Key"
    _digests: tuple[tuple[bytes, str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(f"gateway auth scheme {self.scheme!r}: one of {', '.join(SCHEMES)}")
        if not self.credentials:
            raise ConfigError("the gateway needs at least one credential: it never forwards anonymous calls")
        digests = []
        for secret, principal in self.credentials.items():
            if len(secret) < 16:
                raise ConfigError(f"the secret of {principal!r} is shorter than 16 characters")
            digests.append((hashlib.sha256(secret.encode()).digest(), check_principal(principal)))
        object.__setattr__(self, "_digests", tuple(digests))

    @classmethod
    def bearer(cls, tokens: Mapping[str, str]) -> GatewayAuth:
        return cls(tokens, "bearer")

    @classmethod
    def api_key(cls, keys: Mapping[str, str], header: str = "X-API-Key") -> GatewayAuth:
        return cls(keys, "apikey", header)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], scheme: str = "bearer", header: str = "X-API-Key"
    ) -> GatewayAuth:
        """Read ``PRINCIPAL SECRET`` lines (``#`` starts a comment). Like a key file, the file must
        not be readable by group or others."""
        p = Path(path)
        try:
            st = p.stat()
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{p}: not a regular file; give a file of PRINCIPAL SECRET lines")
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(f"{p}: readable by group or others; run `chmod 600 {p}`")
            if st.st_size > MAX_CREDENTIALS_FILE:
                raise ConfigError(f"{p}: larger than {MAX_CREDENTIALS_FILE} bytes; is it a credentials file?")
            text = p.read_bytes()[: MAX_CREDENTIALS_FILE + 1].decode("utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read it ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{p}: not UTF-8 text (byte {exc.start}); give a text file of PRINCIPAL SECRET lines"
            ) from None
        creds: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConfigError(f"{p}:{n}: expected PRINCIPAL SECRET")
            principal, secret = parts
            if secret in creds:
                raise ConfigError(f"{p}:{n}: this secret is already given to another principal")
            creds[secret] = principal
        return cls(creds, scheme, header)

    def authenticate(self, headers: Mapping[str, str]) -> str | None:
        """The principal the request's credential names, or None. ``headers``: lowercase names."""
        if self.scheme == "bearer":
            kind, _, secret = headers.get("authorization", "").partition(" ")
            if kind.lower() != "bearer":
                return None
        else:
            secret = headers.get(self.header.lower(), "")
        if not secret:
            return None
        digest = hashlib.sha256(secret.strip().encode()).digest()
        found = None
        for known, principal in self._digests:  # every entry, whatever matched
            if hmac.compare_digest(digest, known):
                found = principal
        return found

    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401."""
        if self.scheme == "bearer":
            return 'Bearer realm="iac-a2a-gateway"'
        return f'ApiKey realm="iac-a2a-gateway", header="{self.header}"'

    def declare(self, card: pb.AgentCard) -> None:
        """Declare the scheme in ``card`` (``security_schemes`` and ``security_requirements``)."""
        if self.scheme == "bearer":
            scheme = pb.SecurityScheme(
                http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                    scheme="Bearer", description="a token the gateway's operator issued"
                )
            )
        else:
            scheme = pb.SecurityScheme(
                api_key_security_scheme=pb.APIKeySecurityScheme(
                    location="header", name=self.header, description="a key the gateway's operator issued"
                )
            )
        card.security_schemes[SCHEME_NAME].CopyFrom(scheme)
        del card.security_requirements[:]
        card.security_requirements.add().schemes[SCHEME_NAME].CopyFrom(pb.StringList())


__all__ = ["SCHEMES", "SCHEME_NAME", "GatewayAuth"]
