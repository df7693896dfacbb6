"""The transports a node will dial, imported before its first dial.

The first dial of a scheme would import its adapter (for QUIC also aioquic, its congestion
control and the certificate code; for TLS the IDNA codec that ssl encodes host names with): tens
of milliseconds in the first request of a process. :meth:`iac.Node.start` and
:meth:`iac.Node.add_peer` call :func:`import_transports` with the addresses the node will dial.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable

from iac.errors import ConfigError

#: What the first dial of a scheme imports: its adapter, and for QUIC the backend (aioquic), its
#: congestion control and the certificate code; the IDNA codec that ssl encodes host names with,
#: and the thread pool that resolves them. Node.start() and add_peer() import them,
#: so that the first request of a process costs a dial, not tens of milliseconds of imports.
_DIAL_IMPORTS = {
    "quic": (
        "iac.transport.quic",
        "iac.transport.quic.backend",
        "iac.transport.quic.congestion.adapter",
        "cryptography.hazmat.backends.openssl",
        "encodings.idna",
        "concurrent.futures.thread",
    ),
    "tls": ("iac.transport.tls", "encodings.idna", "concurrent.futures.thread"),
    "unix": ("iac.transport.unix",),
}
_imported_schemes: set[str] = set()


def import_transports(urls: Iterable[str]) -> None:
    """Import what dialing each URL's scheme needs (once per scheme and process)."""
    for url in urls:
        scheme = url.partition("://")[0]
        if scheme in _imported_schemes or scheme not in _DIAL_IMPORTS:
            continue
        _imported_schemes.add(scheme)
        modules = [importlib.import_module(name) for name in _DIAL_IMPORTS[scheme]]
        if scheme == "quic":
            with contextlib.suppress(ConfigError):  # no backend installed: the dial says so
                modules[1].get_backend()


__all__ = ["import_transports"]
