"""Helpers for testing code built on IAC (the library's own tests use them too).

* :func:`node_pair`: two started nodes on loopback (a UNIX socket in a temporary
  directory, or TLS/QUIC on ``127.0.0.1``), closed and cleaned up afterwards.
* :func:`eventually` / :func:`eventually_sync`: wait for a condition that has no
  signal of its own (a counter in ``node.stats()``), failing at a deadline.
* :class:`ManualClock`: a clock a test moves by hand (``Node(clock=...)``).
* :class:`UnixTap`: a transparent wiretap in front of a ``unix://`` listener that
  records every frame that crossed, decoded.
* :class:`UdpRelay` and :class:`Impairment`: a seeded UDP relay that adds delay,
  jitter, loss, reordering and duplication (QUIC under bad network conditions).
* :class:`NatLab`: hosts behind real NATs in Linux network namespaces (root only).

Nothing in the library imports this package.
"""

from iac.protocol.clock import ManualClock
from iac.testing.nat import NatLab
from iac.testing.nodes import NodePair, node_pair
from iac.testing.relay import Captured, Impairment, RelayStats, UdpRelay
from iac.testing.tap import DOWN, UP, TappedFrame, UnixTap
from iac.testing.waiting import eventually, eventually_sync

__all__ = [
    "DOWN",
    "UP",
    "Captured",
    "Impairment",
    "ManualClock",
    "NatLab",
    "NodePair",
    "RelayStats",
    "TappedFrame",
    "UdpRelay",
    "UnixTap",
    "eventually",
    "eventually_sync",
    "node_pair",
]
