"""Free loopback ports for tests: bound once to port 0, read, released (nothing listens after)."""

from __future__ import annotations

import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port of ``kind`` (TCP unless told) that nothing listens on."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_port() -> int:
    """A loopback UDP port that nothing listens on."""
    return free_port(socket.SOCK_DGRAM)
