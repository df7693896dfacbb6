"""UDP segmentation offload (GSO, Linux ``UDP_SEGMENT``) for the QUIC adapter's sends.

A flush of one QUIC connection yields a list of datagrams, most of them the same size and all
to one address (a train of full packets and a shorter last one). With GSO the train leaves in
one ``sendmsg`` carrying a ``UDP_SEGMENT`` control message with the segment size; the kernel
(or the NIC) cuts it into datagrams, so the peer receives exactly what separate sends would
have sent, at a fraction of the system calls.

* :func:`supported` probes once per process whether the kernel takes the option (Linux 4.18+);
  elsewhere every send is a plain ``sendto``.
* :func:`trains` (pure) groups a flush into runs that one ``sendmsg`` can carry: consecutive
  datagrams to one address, all of one size but the last (which may be shorter), at most
  :data:`MAX_SEGMENTS` of them and :data:`MAX_TRAIN_BYTES` in all.
* :class:`GsoSender` sends one flush: a train of two or more datagrams with one ``sendmsg``,
  a single datagram with the transport's ``sendto``. A ``sendmsg`` that fails with anything but
  a full socket buffer (a device without checksum offload answers ``EIO``) turns GSO off for
  this sender and the train goes out datagram by datagram; a full buffer hands the rest of the
  flush to the transport, which queues it as it would any send.

Python has no ``sendmmsg``, so datagrams to different addresses (different connections on a
shared listener socket) cannot share a system call: one train per connection and flush is
what the platform allows from Python.
"""

from __future__ import annotations

import socket
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: ``UDP_SEGMENT`` (``linux/udp.h``), where the socket module lacks the name.
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
SOL_UDP = getattr(socket, "SOL_UDP", 17)
#: The kernel's limit of segments per send (``UDP_MAX_SEGMENTS``, 64 before Linux 6.x).
MAX_SEGMENTS = 64
#: A GSO send is one UDP datagram to the socket layer: at most 65,535 bytes with the headers.
MAX_TRAIN_BYTES = 65000

_supported: bool | None = None


def supported() -> bool:
    """Whether this kernel takes ``UDP_SEGMENT`` (probed once on a throw-away socket)."""
    global _supported
    if _supported is None:
        _supported = probe(socket.socket)
    return _supported


def probe(make_socket: Any) -> bool:
    """Whether a UDP socket from ``make_socket(family, type)`` takes ``UDP_SEGMENT``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with make_socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(SOL_UDP, UDP_SEGMENT, 1200)
    except OSError:
        return False
    return True


def trains(datagrams: Sequence[tuple[bytes, Any]]) -> list[tuple[list[bytes], Any]]:
    """Group ``(datagram, address)`` pairs, in order, into GSO trains (see the module docstring)."""
    out: list[tuple[list[bytes], Any]] = []
    current: list[bytes] = []
    addr: Any = None
    size = total = 0
    for data, dest in datagrams:
        n = len(data)
        if (
            current
            and dest == addr
            and n <= size
            and len(current) < MAX_SEGMENTS
            and total + n <= MAX_TRAIN_BYTES
            and len(current[-1]) == size  # only the last of a train may be shorter
        ):
            current.append(data)
            total += n
            continue
        if current:
            out.append((current, addr))
        current, addr, size, total = [data], dest, n, n
    if current:
        out.append((current, addr))
    return out


@dataclass
class GsoStats:
    """What one :class:`GsoSender` did."""

    #: ``sendmsg`` calls that carried a train, and the datagrams in them.
    trains: int = 0
    segments: int = 0
    #: Datagrams sent one by one (single ones, and every one once GSO is off).
    plain: int = 0
    #: Trains whose ``sendmsg`` failed (then GSO is off for the sender).
    failures: int = 0


class GsoSender:
    """Sends one flush of datagrams on ``sock`` (the raw UDP socket) and ``transport`` (its
    asyncio transport, for single datagrams and whatever does not fit the socket buffer)."""

    def __init__(self, sock: Any, transport: Any, *, enabled: bool = True) -> None:
        self.sock = sock
        self.transport = transport
        self.enabled = enabled
        self.stats = GsoStats()
        #: The last ``sendmsg`` error that turned GSO off.
        self.error: OSError | None = None
        self.pending: list[tuple[bytes, Any]] = []

    def sendto(self, data: bytes, addr: Any = None) -> None:
        """Gather one datagram (the transport's signature, so the library's flush can use it)."""
        self.pending.append((data, addr))

    def flush(self) -> None:
        """Send what was gathered since the last flush."""
        datagrams, self.pending = self.pending, []
        if not datagrams:
            return
        if not self.enabled:
            self._plain(datagrams)
            return
        if self.transport.get_write_buffer_size():  # the socket is full: keep the order
            self._plain(datagrams)
            return
        groups = trains(datagrams)
        for i, (segments, addr) in enumerate(groups):
            if len(segments) < 2 or not self.enabled:
                self._plain([(d, addr) for d in segments])
                continue
            try:
                self.sock.sendmsg(
                    [b"".join(segments)],
                    [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(segments[0])))],
                    0,
                    addr,
                )
            except BlockingIOError:  # the socket buffer is full: the transport queues the rest
                rest = [(d, a) for segs, a in groups[i:] for d in segs]
                self._plain(rest)
                return
            except OSError as exc:  # EIO (no checksum offload), EINVAL: never again on this socket
                self.stats.failures += 1
                self.enabled = False
                self.error = exc
                self._plain([(d, addr) for d in segments])
                continue
            self.stats.trains += 1
            self.stats.segments += len(segments)

    def _plain(self, datagrams: Sequence[tuple[bytes, Any]]) -> None:
        for data, addr in datagrams:
            self.transport.sendto(data, addr)
        self.stats.plain += len(datagrams)


__all__ = ["MAX_SEGMENTS", "MAX_TRAIN_BYTES", "GsoSender", "GsoStats", "probe", "supported", "trains"]
