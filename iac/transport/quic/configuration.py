"""The library's ``QuicConfiguration`` for each side: ALPN, certificates, verification, idle timer,
congestion control.

Default mode: the server presents the node's self-signed certificate (or the
configured one) and the client does not verify it against a CA; the HELLO's
channel binding (SHA-256 of the certificate DER) ties the HELLOs to this very
TLS session. CA mode (``ca_file``): the client verifies the server's chain and
presents its own CA-signed certificate; the server asks for it (on every full
handshake) and the listener verifies it (``iac.transport.quic.listener``).
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from iac.protocol.handshake import ALPN
from iac.transport.base import TransportConfig
from iac.transport.certs import node_certificate
from iac.transport.debug import set_quic_debugging
from iac.transport.quic.ackfreq import AckFrequencySettings
from iac.transport.quic.backend import Backend
from iac.transport.quic.congestion import configure as configure_congestion
from iac.transport.quic.pmtud import PmtuSettings
from iac.wire.identity import Identity

#: QUIC's own idle timeout when ``idle_timeout`` is None (keep-alive still detects a dead peer).
_NO_IDLE = 365 * 86400.0


def transport_idle(config: TransportConfig) -> float:
    """QUIC's own idle timer notices a dead peer: three keep-alive intervals without an
    answer. (``idle_timeout``, no frame moving, is IAC's and closes with IDLE_TIMEOUT.)"""
    return min(3 * config.keepalive_interval, _NO_IDLE)


def client_configuration(
    config: TransportConfig, host: str, backend: Backend, identity: Identity | None = None
) -> Any:
    """The dialing side's configuration for ``host`` (CA mode: with ``identity``'s certificate,
    which a CA-mode server asks for)."""
    qc = backend.QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN],
        idle_timeout=transport_idle(config),
        # CA mode verifies the chain, not a host name (as on TLS/TCP): the HELLO proves the
        # AgentId, and node certificates name nodes, not the addresses they listen on.
        server_name=None if config.ca_file is not None else host,
    )
    configure_congestion(qc, config.congestion, backend)
    _configure_pmtud(qc, config)
    if config.ca_file is not None:
        qc.verify_mode = ssl.CERT_REQUIRED
        qc.load_verify_locations(cafile=config.ca_file)
        if identity is not None:
            qc.certificate, qc.private_key, qc.certificate_chain, _der = _load_certificate(
                identity, config, backend
            )
    else:
        qc.verify_mode = ssl.CERT_NONE
    set_quic_debugging(qc, config.qlog_dir)  # SSLKEYLOGFILE and qlog, when asked
    return qc


def server_configuration(identity: Identity, config: TransportConfig, backend: Backend) -> tuple[Any, bytes]:
    """The accepting side's configuration and the DER of the certificate it presents."""
    qc = backend.QuicConfiguration(
        is_client=False, alpn_protocols=[ALPN], idle_timeout=transport_idle(config)
    )
    configure_congestion(qc, config.congestion, backend)
    _configure_pmtud(qc, config)
    qc.certificate, qc.private_key, qc.certificate_chain, der = _load_certificate(identity, config, backend)
    set_quic_debugging(qc, config.qlog_dir)  # SSLKEYLOGFILE and qlog, when asked
    return qc, der


def _configure_pmtud(qc: Any, config: TransportConfig) -> None:
    """Path MTU discovery's and segmentation offload's settings travel with the library's
    configuration to each of its connections (the asyncio protocol reads them,
    :mod:`iac.transport.quic.pathmtu`, :mod:`iac.transport.quic.gso`); the library itself
    keeps building 1,200-byte packets until a probe allows more."""
    with contextlib.suppress(AttributeError):  # a library whose configuration has slots
        qc.iac_pmtud = PmtuSettings(enabled=config.quic_pmtud, max_size=config.quic_max_datagram_size)
        qc.iac_gso = config.quic_gso
        qc.iac_ack_frequency = AckFrequencySettings(enabled=config.quic_ack_frequency)


def _load_certificate(
    identity: Identity, config: TransportConfig, backend: Backend
) -> tuple[Any, Any, list[Any], bytes]:
    """``(certificate, private_key, chain, certificate DER)`` for the backend: the
    configured files, else the node's self-signed certificate (the binding makes it safe)."""
    node = node_certificate(identity.agent_id, config.cert_file, config.key_file)
    chain_pem = node.chain_pem or node.cert_pem
    der = x509.load_pem_x509_certificates(chain_pem)[0].public_bytes(serialization.Encoding.DER)
    cert, key, chain = backend.load_certificates(chain_pem, node.key_pem)
    return cert, key, chain, der


__all__ = ["client_configuration", "server_configuration", "transport_idle"]
