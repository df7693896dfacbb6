"""The node's connection bound, sans-IO: how many connections its listeners hold at once.

Every listener given one :class:`~iac.transport.base.TransportConfig` (and its copies made
with ``dataclasses.replace``) shares one :class:`ConnectionBound`. A connection is counted
from the moment a listener takes it (before its TLS or HELLO exchange) until it is over.
Over the bound a new connection is refused at once with ``busy``
(:func:`bound_error`: GOAWAY on TLS/TCP and UNIX, the same close code on QUIC) before any
signature is checked. Stream connections (TLS/TCP, UNIX) each hold a file descriptor, so
they are also bounded by ``RLIMIT_NOFILE`` less :data:`FD_RESERVE`: the listener refuses
and closes them before the process runs out of descriptors (where ``accept`` would fail
and retry). QUIC connections share the listener's socket and count only against
``max_connections``. Refusals are logged at most once per :data:`LOG_INTERVAL_S`, with
their count.

Nothing here reads a clock: :meth:`ConnectionBound.refused` takes ``now`` (seconds).
"""

from __future__ import annotations

import contextlib

from iac.errors import ConfigError, HandshakeError

#: Default ``TransportConfig.max_connections``.
DEFAULT_MAX_CONNECTIONS = 16_384
#: Descriptors kept free below ``RLIMIT_NOFILE`` (store files, logs, dials, a refusal's socket).
FD_RESERVE = 64
#: Refusals are logged at most this often (seconds), with how many there were.
LOG_INTERVAL_S = 10.0


def nofile_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process (None: unlimited, or no such limit here)."""
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            return int(soft)
    return None


def bound_error(limit: int) -> HandshakeError:
    """The refusal of a connection over the bound (``handshake_failed``, reason ``busy: …``)."""
    return HandshakeError(f"busy: the node holds its bound of {limit} connections; try again later")


class ConnectionBound:
    """Connections held by a node's listeners, against ``max_connections`` and, for those
    that hold a descriptor, ``RLIMIT_NOFILE`` less :data:`FD_RESERVE` (read at creation;
    ``nofile`` overrides it in tests)."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS, nofile: int | None = -1) -> None:
        if max_connections < 1:
            raise ConfigError("max_connections must be at least 1")
        self.max_connections = max_connections
        nofile = nofile_limit() if nofile == -1 else nofile
        #: Stream connections allowed by the descriptor limit (None: no such limit).
        self.fd_limit = None if nofile is None else max(1, nofile - FD_RESERVE)
        #: Connections held now, and of them those holding a descriptor.
        self.held = 0
        self.fds = 0
        #: Connections refused in all, and since the last log line.
        self.refusals = 0
        self._unlogged = 0
        self._next_log: float | None = None

    def limit(self, *, fd: bool) -> int:
        """The bound that applies to a new connection (``fd``: it holds a descriptor)."""
        if fd and self.fd_limit is not None:
            return min(self.max_connections, self.fd_limit)
        return self.max_connections

    def try_take(self, *, fd: bool) -> bool:
        """Count a new connection; False (nothing counted) when it is over the bound."""
        if self.held >= self.max_connections:
            return False
        if fd and self.fd_limit is not None and self.fds >= self.fd_limit:
            return False
        self.held += 1
        if fd:
            self.fds += 1
        return True

    def give(self, *, fd: bool) -> None:
        """A counted connection is over."""
        self.held = max(0, self.held - 1)
        if fd:
            self.fds = max(0, self.fds - 1)

    def refused(self, now: float) -> int:
        """Count a refusal; return how many to log now (this one and those not logged yet),
        or 0 while the last log line is less than :data:`LOG_INTERVAL_S` old."""
        self.refusals += 1
        self._unlogged += 1
        if self._next_log is not None and now < self._next_log:
            return 0
        self._next_log = now + LOG_INTERVAL_S
        n, self._unlogged = self._unlogged, 0
        return n


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "FD_RESERVE",
    "LOG_INTERVAL_S",
    "ConnectionBound",
    "bound_error",
    "nofile_limit",
]
