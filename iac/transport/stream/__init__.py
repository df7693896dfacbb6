"""Frames back to back on one byte stream (TLS/TCP and UNIX sockets).

The adapters in :mod:`iac.transport.tls` and :mod:`iac.transport.unix` open the
socket with a :class:`FrameProtocol` (:mod:`.protocol`: a plain asyncio protocol
around a frame decoder) and hand it to :func:`establish` (:mod:`.connection`),
which runs the HELLO exchange and returns a :class:`StreamConnection` (the asyncio
adapter around :class:`~iac.transport.core.ConnectionCore`, which decides its state,
close error, backlog judging and idle timer).
:class:`StreamListener` (:mod:`.listener`) does the same for every accepted
socket. No task sits between the socket and the application:

* reading: the transport's ``data_received`` decodes and judges the frames
  (:class:`SessionLogic`) and puts them straight into the bounded receive queue
  (:class:`~iac.transport.queues.Inbox`), waking ``recv()``. They stay
  compressed there, counted at their decompressed size against the connection's
  and the node's receive budget; ``recv()`` decompresses what it takes. Frames
  that do not fit stay in a backlog (at most one read's worth) and reading stops
  until ``recv()`` (or another connection of the node) gave budget back.
* writing: ``send()`` queues the frame and, once per event-loop turn, one
  callback writes everything queued in that turn with one ``write``. While the
  transport is above its high-water mark nothing is written; frames wait in the
  bounded send queue and ``send()`` waits when it is full.

Closing: the closing side flushes what is queued (``close()``; a protocol error
drops it instead), writes GOAWAY, then keeps reading and discarding until the
peer hangs up or ``linger_timeout`` passes, and only then closes the socket —
closing with unread input would make TCP send a reset that can destroy the
GOAWAY before the peer reads it. A peer's GOAWAY closes the socket at once.

Idle: a connection on which no frame moved either way for ``idle_timeout`` is
closed with GOAWAY IDLE_TIMEOUT (there is no PING frame; a dead peer is found by
TCP keep-alive probes every ``keepalive_interval`` on TLS/TCP, by the kernel on
UNIX sockets, and by any write).
"""

from __future__ import annotations

from iac.transport.stream.connection import StreamConnection, establish
from iac.transport.stream.listener import StreamListener
from iac.transport.stream.protocol import NETWORK_ERRORS, FrameProtocol

__all__ = [
    "NETWORK_ERRORS",
    "FrameProtocol",
    "StreamConnection",
    "StreamListener",
    "establish",
]
