"""The QUIC adapter (aioquic 1.7, or qh3 2.x: see :mod:`.backend`).

How IAC maps onto QUIC (docs/PROTOCOL.md, "QUIC mapping"):

* ALPN ``iac/1``; a self-signed certificate per node (or the configured one).
  The client does not verify it against a CA; the HELLO's channel binding
  (SHA-256 of the certificate DER) ties the HELLOs to this very TLS session.
* The client opens bidirectional stream 0, the *control stream*, and sends
  HELLO; the server answers HELLO on it. GOAWAY travels on it as well.
* Every message goes on a new unidirectional stream. Frames queued in the same
  event-loop turn leave with one ``transmit()``; small ones share a stream
  (up to :data:`SHARE_LIMIT` bytes per stream). A stream is opened only when
  the peer's stream credit allows it; frames wait in this adapter's bounded
  queue otherwise (aioquic's own queue of blocked streams is scanned on every
  packet build, so it is never used). ``send()`` waits while the queue is full.
* Flushing: after a received datagram the flush is deferred to the end of the loop
  turn, so a reply that the woken ``recv()`` caller sends leaves in the same packet
  as the ACK; a packet that carries frames also carries any pending ACK (aioquic
  would otherwise hold it for its 1 ms ack delay and send it alone).
* Received stream data is handled as raw QUIC events (the stock protocol keeps
  a reader per stream forever) by :mod:`.inbound`: one frame decoder per open
  stream; frames stay compressed until ``recv()`` takes them, counted at their
  decompressed size against ``recv_budget_bytes`` and the node's
  ``memory_budget_bytes``. A receiver whose budget is spent withholds new stream
  credit; partly received frames, the stream data the library holds behind
  gaps and unjudged frames beyond ``recv_budget_bytes`` close the connection
  (``buffer_exceeded``). Frames that overtake the HELLO are
  held compressed (``early_frames_limit``, ``early_frames_bytes``) until it
  verifies.
* Refusals close the connection with the close code as QUIC application error
  code and the reason as reason phrase; the dialing side raises the typed error
  (:func:`iac.protocol.handshake.error_from_close`).
* Keep-alive: a QUIC PING every ``keepalive_interval``; QUIC's own idle timer
  (three keep-alive intervals) notices a dead peer; ``idle_timeout`` closes a
  connection on which no frame moved (IDLE_TIMEOUT).
* 0-RTT: a client given a :class:`ClientTicketStore` resumes with the ticket it
  got from the same address and sends HELLO and its first frames as early data;
  servers make tickets single-use (:class:`ServerTicketStore`).
* Backends: the QUIC library is chosen per listener and per dial (``backend=``,
  else :func:`set_backend`, ``IAC_QUIC_BACKEND``, the automatic choice); the
  library-specific internals live in :mod:`.backend`. The two interoperate.

Modules: :mod:`.protocol` (the asyncio protocol: raw events in, flushes out),
:mod:`.streams` (frames into and out of QUIC streams), :mod:`.inbound` (the
receive path and its bounds), :mod:`.connection`
(:class:`QuicConn`, the adapter around :mod:`iac.transport.core`), :mod:`.dial`
(:func:`dial_quic`, 1-RTT and 0-RTT),
:mod:`.listener` (:class:`QuicListener`, :func:`listen_quic`),
:mod:`.configuration` (certificates and the library's configuration),
:mod:`.tickets` (session tickets), :mod:`.backend` (aioquic or qh3).
"""

from __future__ import annotations

from iac.transport.quic.backend import set_backend
from iac.transport.quic.connection import QuicConn
from iac.transport.quic.dial import dial_quic
from iac.transport.quic.listener import QuicListener, listen_quic
from iac.transport.quic.streams import SHARE_LIMIT, QuicStats
from iac.transport.quic.tickets import ClientTicketStore, ServerTicketStore

__all__ = [
    "SHARE_LIMIT",
    "ClientTicketStore",
    "QuicConn",
    "QuicListener",
    "QuicStats",
    "ServerTicketStore",
    "dial_quic",
    "listen_quic",
    "set_backend",
]
