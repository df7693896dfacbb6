"""Node certificates for TLS and QUIC.

Default mode: every node makes a self-signed certificate at start (EC P-256,
subject CN = its AgentId). Nobody verifies it against a CA: the HELLO's channel
binding (SHA-256 of the server certificate, signed by both agents' Ed25519 keys)
is what secures the connection, so a relay that presents its own certificate is
refused.

CA mode (optional): ``iac certs init`` makes a private CA and node certificates
in a folder (default ``certs/``). A node given ``ca_file``, ``cert_file`` and
``key_file`` presents its CA-signed certificate and verifies the peer's chain
against the CA, on top of the binding. TLS/TCP verifies with OpenSSL; the QUIC
server verifies client chains itself (:func:`verify_client_chain`: RFC 5280 path
validation by ``cryptography``, which wants the leaf to carry a subjectAltName
and, when it has an extendedKeyUsage, clientAuth — as ``iac certs init`` makes them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from iac.errors import ConfigError, HandshakeError
from iac.protocol.handshake import channel_binding
from iac.wire.private import write_private

DEFAULT_VALID_DAYS = 825
CA_VALID_DAYS = 3650


@dataclass(frozen=True)
class NodeCertificate:
    """A certificate (PEM and DER) with its private key (PEM). The repr hides the key."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    cert_der: bytes = field(repr=False)
    chain_pem: bytes = field(default=b"", repr=False)  # intermediates after the leaf, if any

    @property
    def binding(self) -> bytes:
        """The channel binding a client computes for this certificate."""
        return channel_binding(self.cert_der)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> NodeCertificate:
        try:
            certs = x509.load_pem_x509_certificates(cert_pem)
            serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as exc:
            raise ConfigError(f"not a PEM certificate and key: {exc}") from None
        leaf = certs[0]
        der = leaf.public_bytes(serialization.Encoding.DER)
        return cls(leaf.public_bytes(serialization.Encoding.PEM), key_pem, der, cert_pem)

    @classmethod
    def load(cls, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> NodeCertificate:
        try:
            cert_pem = Path(cert_file).read_bytes()
            key_pem = Path(key_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read certificate or key: {exc}") from None
        return cls.from_pem(cert_pem, key_pem)

    @contextlib.contextmanager
    def files(self) -> Iterator[tuple[str, str]]:
        """The certificate and key as files in a private temporary folder (``ssl`` loads
        only from files); removed on exit."""
        with tempfile.TemporaryDirectory(prefix="iac-cert-") as d:
            os.chmod(d, 0o700)
            cert = os.path.join(d, "cert.pem")
            key = os.path.join(d, "key.pem")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem)
            Path(cert).write_bytes(self.chain_pem or self.cert_pem)
            yield cert, key

    def load_into(self, ctx: ssl.SSLContext) -> None:
        with self.files() as (cert, key):
            ctx.load_cert_chain(cert, key)

    def __repr__(self) -> str:
        return f"NodeCertificate(sha256={self.binding.hex()[:16]}…)"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _leaf_builder(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    days: int,
    valid_from: dt.datetime | None = None,
) -> x509.CertificateBuilder:
    now = _now()
    start, end = (now - dt.timedelta(hours=1), now) if valid_from is None else (valid_from, valid_from)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(_dns_label(common_name))]), critical=False)
    )


def _dns_label(name: str) -> str:
    label = "".join(c if c.isalnum() or c in "-." else "-" for c in name.lower()).strip("-.")
    return label[:253] or "iac-node"


def generate_self_signed(common_name: str, *, days: int = DEFAULT_VALID_DAYS) -> NodeCertificate:
    """A fresh self-signed node certificate (EC P-256)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf_builder(common_name, key, _name(common_name), days).sign(key, hashes.SHA256())
    return NodeCertificate(
        cert.public_bytes(serialization.Encoding.PEM),
        _key_pem(key),
        cert.public_bytes(serialization.Encoding.DER),
    )


_self_signed: dict[str, NodeCertificate] = {}


def node_certificate(
    agent_id: str, cert_file: str | None = None, key_file: str | None = None
) -> NodeCertificate:
    """The certificate a node presents: loaded from files (CA mode), else one
    self-signed certificate per AgentId for the life of the process."""
    if cert_file is not None and key_file is not None:
        return NodeCertificate.load(cert_file, key_file)
    cert = _self_signed.get(agent_id)
    if cert is None:
        cert = _self_signed[agent_id] = generate_self_signed(agent_id)
    return cert


# --- CA mode ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertAuthority:
    """A private CA: its certificate and key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey = field(repr=False)

    @classmethod
    def create(cls, name: str = "IAC private CA", *, days: int = CA_VALID_DAYS) -> CertAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> CertAuthority:
        d = Path(folder)
        try:
            cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
            key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{d}: cannot load the CA (ca.pem, ca.key): {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{d}/ca.key: expected an EC key")
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self, common_name: str, *, days: int = DEFAULT_VALID_DAYS, valid_from: dt.datetime | None = None
    ) -> NodeCertificate:
        """A node certificate signed by this CA, valid for ``days`` from ``valid_from``
        (default: an hour ago)."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _leaf_builder(common_name, key, self.cert.subject, days, valid_from).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
        )
        cert = builder.sign(self.key, hashes.SHA256())
        return NodeCertificate(
            cert.public_bytes(serialization.Encoding.PEM),
            _key_pem(key),
            cert.public_bytes(serialization.Encoding.DER),
        )


_ca_stores: dict[str, tuple[float, Store]] = {}


def _ca_store(ca_file: str) -> Store:
    """The CA certificates of ``ca_file`` (re-read when the file changes)."""
    try:
        mtime = os.stat(ca_file).st_mtime
        cached = _ca_stores.get(ca_file)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        store = Store(x509.load_pem_x509_certificates(Path(ca_file).read_bytes()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{ca_file}: cannot load CA: {exc}") from None
    _ca_stores[ca_file] = (mtime, store)
    return store


def verify_client_chain(chain: Sequence[bytes], ca_file: str, now: dt.datetime | None = None) -> None:
    """Check a client's certificate chain (DER, leaf first) against the CA in ``ca_file`` at
    ``now``; ``admission_denied`` saying why when there is none or it does not verify."""
    if not chain:
        raise HandshakeError(
            "client certificate required: this node admits only certificates of its CA",
            reason="admission_denied",
        )
    try:
        leaf, *rest = (x509.load_der_x509_certificate(der) for der in chain)
    except ValueError as exc:
        raise HandshakeError(
            f"client certificate refused: cannot parse it ({exc})", reason="admission_denied"
        ) from None
    verifier = PolicyBuilder().store(_ca_store(ca_file)).time(now or _now()).build_client_verifier()
    try:
        verifier.verify(leaf, rest)
    except VerificationError as exc:
        raise HandshakeError(f"client certificate refused: {exc}", reason="admission_denied") from None


def _write_private(path: Path, data: bytes, overwrite: bool) -> None:
    try:
        write_private(path, data, overwrite=overwrite)
    except FileExistsError:
        raise ConfigError(f"{path}: already exists (use --force to replace)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write it: {exc.strerror or exc}") from None


def _write_public(path: Path, data: bytes, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (use --force to replace)")
    path.write_bytes(data)


def init_ca(
    folder: str | os.PathLike[str], nodes: Sequence[str] = ("node",), *, overwrite: bool = False
) -> list[Path]:
    """Create ``ca.pem``/``ca.key`` (unless the folder already has a CA) and one
    ``<name>.pem``/``<name>.key`` pair per node name; return the files written."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if (d / "ca.pem").exists() and (d / "ca.key").exists() and not overwrite:
        ca = CertAuthority.load(d)
    else:
        ca = CertAuthority.create()
        _write_public(d / "ca.pem", ca.cert_pem, overwrite=True)
        _write_private(d / "ca.key", _key_pem(ca.key), overwrite=True)
        written += [d / "ca.pem", d / "ca.key"]
    for name in nodes:
        if not name or "/" in name or name.startswith(".") or name == "ca":
            raise ConfigError(f"{name!r}: a node name is a plain file name, not 'ca'")
        node = ca.issue(name)
        _write_public(d / f"{name}.pem", node.cert_pem, overwrite)
        _write_private(d / f"{name}.key", node.key_pem, overwrite)
        written += [d / f"{name}.pem", d / f"{name}.key"]
    return written


__all__ = [
    "CertAuthority",
    "NodeCertificate",
    "generate_self_signed",
    "init_ca",
    "node_certificate",
    "verify_client_chain",
]
