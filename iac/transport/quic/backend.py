"""The QUIC library under the QUIC adapter: aioquic (the required dependency) or qh3.

The adapter (:mod:`iac.transport.quic`) drives a sans-IO QUIC connection through
a few private attributes that differ between the libraries; this module gathers
them in one :class:`Backend` per library, so that the adapter holds no import of
either and one process can run both (a listener keeps the backend it started
with, a connection the one it dialed with).

Choice, first match wins: :func:`set_backend` (code), the environment variable
``IAC_QUIC_BACKEND`` (``aioquic`` or ``qh3``), else :data:`AUTO_ORDER` — the first
installed library in it.

qh3 (2.1, a compiled packet core behind aioquic's API) works with this adapter
for the handshake, 0-RTT and the conformance cases, but is not offered (it is
not in :data:`AUTO_ORDER`, only used when asked for, and no extra installs it):

* its core raises from ``datagrams_to_send()``: "packet builder capacity
  exhausted" on a qh3 server answering an aioquic client's first Initial, on
  every connection; "reserved stream is missing" with qh3 on both sides once
  datagrams are reordered or lost (a flush is lost and recovered by
  retransmission, the error surfaces in the event loop's handler). Minimal
  reproductions: ``tools/qh3/``; docs/PROTOCOL.md records the evaluation;
* it offers no control over the stream credit it grants (the MAX_STREAMS it
  sends), so receive-side backpressure cannot withhold credit: a reader that
  falls behind fills ``recv_budget_bytes`` and the connection closes with
  BUFFER_EXCEEDED instead of slowing the sender (:attr:`Backend.credit_control`);
* the stream data its core holds for reassembly (behind a gap) is out of reach,
  so it is not counted against the receive budget (:attr:`Backend.reassembly_bytes`).

``tests/test_quic_backends.py`` runs every client/server pair when qh3 is installed.

Server hooks (aioquic only; each reaches a private attribute, so each is pinned to
the aioquic minor it was written for, :data:`AIOQUIC_PINNED`, and left None on
another version or on qh3):

* ``request_client_certificate``: CA mode. aioquic's server asks for a client
  certificate only through a test flag of its TLS context
  (``tls.Context._request_client_certificate``), and would then also wait for
  one on a resumed session, where a client never sends it; the hook wraps the
  connection's traffic-key callback (``QuicConnection._update_traffic_key``) and
  sets the flag when the server derives its handshake keys, on full handshakes only.
* ``peer_certificate_chain``: the client's certificates (``tls._peer_certificate``
  and ``tls._peer_certificate_chain``); aioquic's server never verifies them.
* ``connection_tickets``: per-connection session-ticket callbacks
  (``QuicConnection._session_ticket_fetcher`` / ``_session_ticket_handler``), so a
  ticket can carry the client identity its connection verified.
* ``initial_gate`` and ``set_retry``: the listener's look at each datagram before
  the library's server takes it (``QuicServer._protocols``, ``_configuration``)
  and Retry switched on and off (``QuicServer._retry``).
* ``attach_dialed``: a dialed connection on the listener's own UDP socket (one
  socket per node, so that the address a peer observes for the node's dials is
  the address it listens on: docs/PROTOCOL.md, "Through NATs"). The server's
  transport goes to the dialed protocol, and the dialed connection's connection
  IDs go into the server's table (``QuicServer._transport``, ``_protocols``,
  ``_connection_id_issued`` / ``_retired`` / ``_terminated``), so that the
  server hands it the datagrams addressed to it.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from iac.errors import ConfigError
from iac.transport.quic.ackfreq import (
    ACK_FREQUENCY,
    IMMEDIATE_ACK,
    AckFrequency,
    AckFrequencyFrame,
    AckFrequencySettings,
    encode_frame,
    encode_min_ack_delay,
    parse_min_ack_delay,
)

#: The backends this module knows.
BACKENDS = ("aioquic", "qh3")
#: Environment variable that selects the backend.
ENV_VAR = "IAC_QUIC_BACKEND"
#: Automatic choice: the first of these that imports (qh3 only on request, see above).
AUTO_ORDER: tuple[str, ...] = ("aioquic",)
#: What installs each optional backend (no iac extra: qh3 is not offered, see above).
INSTALL_HINTS = {"qh3": "pip install qh3"}

#: A session ticket of either library (same fields: a dataclass in both).
SessionTicketLike = Any
#: The aioquic minor version whose private attributes the server hooks use.
AIOQUIC_PINNED = "1.7"


@dataclass(frozen=True)
class PmtuHooks:
    """What path MTU discovery (:mod:`iac.transport.quic.pmtud`) needs of the library's
    connection; aioquic 1.7 only (each reaches private attributes). ``quic`` is the
    library's connection in every call."""

    #: ``(quic, size, now, done) -> datagrams``: build a probe (PING and PADDING, ``size``
    #: bytes of UDP payload, no data) and register it with loss recovery, outside the
    #: congestion window (not counted in flight, its loss not reported to the controller);
    #: ``done(acknowledged)`` is called once its fate is known. Returns the ``(datagram,
    #: address)`` pairs to send (none when it cannot be sent now).
    send_probe: Callable[[Any, int, float, Callable[[bool], None]], list[tuple[bytes, Any]]]
    #: ``(quic, size)``: the largest datagram the connection (and its congestion control) builds.
    set_datagram_size: Callable[[Any, int], None]
    #: ``(quic, on_loss)``: ``on_loss(size, sent_time, now)`` each time loss recovery declares
    #: in-flight packets lost (probes excluded): the largest lost packet's size and the send
    #: time of the latest lost packet larger than 1,200 bytes (None: none was).
    watch_losses: Callable[[Any, Callable[[int, float | None, float], None]], None]
    #: ``(quic, on_acked)``: ``on_acked(size, sent_time)`` for each in-flight packet larger than
    #: 1,200 bytes that is acknowledged (probes excluded: they are not in flight).
    watch_acks: Callable[[Any, Callable[[int, float], None]], None]
    #: The peer's ``max_udp_payload_size`` transport parameter (None: not sent or not known yet).
    peer_max_udp_payload: Callable[[Any], int | None]
    #: The connection's probe timeout (PTO) now, seconds.
    probe_timeout: Callable[[Any], float]
    #: Whether the handshake is confirmed (1-RTT keys in use, probes may go).
    handshake_confirmed: Callable[[Any], bool]
    #: The :class:`~iac.transport.quic.pmtud.PmtuSettings` the connection's configuration
    #: carries (None: none, no probing).
    settings: Callable[[Any], Any]
    #: The largest UDP payload the library builds correctly: the search never probes above it,
    #: whatever ``quic_max_datagram_size`` says.
    largest: int = 65527


#: aioquic 1.7 writes a STREAM or CRYPTO frame's length as a two-byte variable-length integer
#: (at most 16,383): a packet with room for more data than that would carry a corrupt frame
#: (the peer closes with FRAME_ENCODING_ERROR or an unknown frame type). 16,384 bytes of UDP
#: payload leave less than that for data, whatever the header and connection ID sizes.
AIOQUIC_LARGEST_DATAGRAM = 16384


_override: str | None = None


def _peer_address(quic: Any) -> Any:
    """The peer's address (host, port) on the connection's first network path, if known."""
    try:
        paths = quic._network_paths  # (asked before every flush: no getattr() call)
    except AttributeError:
        return None
    return paths[0].addr if paths else None


_cache: dict[str, Backend] = {}


@dataclass(frozen=True)
class Backend:
    """One QUIC library, and how the adapter reaches into it."""

    name: str
    version: str
    QuicConnectionProtocol: type[Any]
    QuicConnection: type[Any]
    QuicConfiguration: type[Any]
    serve: Callable[..., Any]
    events: Any
    SessionTicket: type[Any]
    CipherSuite: type[Any]
    #: Whether the granted stream credit can be held back (receive-side backpressure).
    credit_control: bool
    load_certificates: Callable[[bytes, bytes], tuple[Any, Any, list[Any]]]
    peer_certificate_der: Callable[[Any], bytes | None]
    remote_max_streams_uni: Callable[[Any], int]
    blocked_streams_uni: Callable[[Any], int]
    ack_now: Callable[[Any, float], bool]
    withhold_credit: Callable[[Any, bool, int], int]
    uni_streams_finished: Callable[[Any, bool], bool]
    is_closing: Callable[[Any], bool]
    zero_rtt_ready: Callable[[Any], bool]
    #: Bytes of stream data the library holds for reassembly (out of order, behind a gap).
    reassembly_bytes: Callable[[Any], int]
    #: Lower the receive window a new peer-opened unidirectional stream starts with.
    limit_stream_window: Callable[[Any, int], None]
    #: The library's server (a ``DatagramProtocol``), for a listener that subclasses it.
    QuicServer: type[Any] | None = None
    #: Whether the TLS session of a connection was resumed / its 0-RTT data accepted.
    session_resumed: Callable[[Any], bool] = lambda quic: bool(quic.tls.session_resumed)
    early_data_accepted: Callable[[Any], bool] = lambda quic: bool(quic.tls.early_data_accepted)
    peer_address: Callable[[Any], Any] = _peer_address
    #: The id the connection's next locally opened unidirectional stream gets.
    next_stream_id_uni: Callable[[Any], int] = lambda quic: int(quic._local_next_stream_id_uni)
    #: The UDP transport of the library's server (None once closed).
    server_transport: Callable[[Any], Any] = lambda server: server._transport
    #: Server hooks (see the module docstring); None where unsupported.
    request_client_certificate: Callable[[Any], None] | None = None
    peer_certificate_chain: Callable[[Any], list[bytes]] | None = None
    connection_tickets: Callable[[Any, Callable[[bytes], Any], Callable[[Any], None]], None] | None = None
    #: ``(server, datagram) -> (opens a new connection, carries a token)``.
    initial_gate: Callable[[Any, bytes], tuple[bool, bool]] | None = None
    #: ``(server, on)``: answer new connections without a token with Retry.
    set_retry: Callable[[Any, bool], None] | None = None
    #: ``(server, protocol) -> detach``: a dialed connection on the server's socket.
    attach_dialed: Callable[[Any, Any], Callable[[], None]] | None = None
    #: Path MTU discovery hooks; None where unsupported (the path stays at 1,200 bytes).
    pmtu: PmtuHooks | None = None
    #: ``(quic, transport) -> socket``: the raw UDP socket under ``transport`` when the
    #: connection's configuration asks for segmentation offload (:mod:`.gso`), else None.
    gso_socket: Callable[[Any, Any], Any] | None = None
    #: ``(quic) -> count``: from now on, count the ACK frames the connection processes;
    #: ``count()`` says how many so far (benchmarks: ACK frames per MB sent).
    ack_counter: Callable[[Any], Callable[[], int]] | None = None
    #: Stateless reset hooks (:mod:`.reset`; aioquic only, see :func:`_aioquic_resets`).
    resets: ResetHooks | None = None
    #: ``(quic) -> state``: the ACK Frequency extension (:mod:`.ackfreq`) on a new connection
    #: when its configuration asks for it, else None (aioquic only, :func:`_aioquic_ack_frequency`).
    ack_frequency: Callable[[Any], AckFrequency | None] | None = None
    #: ``(quic)``: a new connection skips a run of PADDING frames in one step (aioquic 1.7
    #: only, :func:`_aioquic_fast_padding`); None: the library's own handler.
    fast_padding: Callable[[Any], None] | None = None
    #: ``(quic) -> (flushed, settled)``: call ``flushed()`` after each flush; ``settled()`` is
    #: True while nothing was declared lost since that flush and it was not limited by the
    #: congestion window: the library then has nothing a datagram of ACKs only could free, and
    #: the adapter skips the flush after such a datagram (aioquic only, :func:`_aioquic`).
    ack_settle: Callable[[Any], tuple[Callable[[], None], Callable[[], bool]]] | None = None
    #: ``(quic, protocol)``: every STREAM frame the connection takes sets ``protocol._evented``,
    #: as an event would, also when the library holds its data back (out of order, or a
    #: duplicate) and gives no event: such a datagram waits for the ACK policy, not an ACK now
    #: (aioquic only, :func:`_aioquic`).
    mark_stream_frames: Callable[[Any, Any], None] | None = None


@dataclass(frozen=True)
class ResetHooks:
    """How the adapter gives a connection's connection IDs their derived reset tokens and
    recognises a stateless reset (:mod:`iac.transport.quic.reset`)."""

    #: ``(quic, token_of)``: the connection's connection IDs get ``token_of(cid)`` as their
    #: reset token, those it issues later too (the library draws random ones).
    issue_tokens: Callable[[Any, Callable[[bytes], bytes]], None]
    #: ``(quic) -> tokens``: the reset tokens of the peer's connection IDs this side used.
    peer_tokens: Callable[[Any], list[bytes]]
    #: ``(quic, datagram) -> bool``: the datagram's destination connection ID is one of this
    #: connection's (then it is a packet of the connection, never a reset).
    owns: Callable[[Any, bytes], bool]
    #: ``(server, datagram) -> cid``: the destination connection ID of a short-header
    #: datagram when no connection on the server's socket has it, else None.
    unknown: Callable[[Any, bytes], bytes | None]
    #: ``(server) -> protocols``: the protocols of the connections on the server's socket.
    protocols: Callable[[Any], list[Any]]
    #: ``(quic)``: the connection ends now, sending nothing (RFC 9000 10.3: after a reset).
    drop: Callable[[Any], None]


# --- aioquic 1.7 ---------------------------------------------------------------------------------


def _aioquic() -> Backend:
    import aioquic
    from aioquic._buffer import Buffer
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer, serve
    from aioquic.quic import events
    from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    from aioquic.quic.packet import QuicPacketType, pull_quic_header
    from aioquic.quic.retry import QuicRetryTokenHandler
    from aioquic.tls import CipherSuite, Direction, Epoch, SessionTicket
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def load_certificates(chain_pem: bytes, key_pem: bytes) -> tuple[Any, Any, list[Any]]:
        certs = x509.load_pem_x509_certificates(chain_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        return certs[0], key, list(certs[1:])

    def peer_certificate_der(quic: Any) -> bytes | None:
        cert = quic.tls._peer_certificate
        return None if cert is None else bytes(cert.public_bytes(serialization.Encoding.DER))

    def ack_now(quic: Any, now: float) -> bool:
        # Data leaves now: the pending ACK rides along (aioquic would hold it for its ack
        # delay and then send it in a packet of its own). True: an ACK was pending.
        spaces = quic._spaces
        try:
            cached = quic._iac_one_rtt  # (the table, its 1-RTT space): no enum hash per send
        except AttributeError:
            cached = None
        if cached is None or cached[0] is not spaces:
            cached = quic._iac_one_rtt = (spaces, spaces.get(Epoch.ONE_RTT))
        space = cached[1]
        if space is not None and space.ack_at is not None:
            space.ack_at = now
            return True
        return False

    def withhold_credit(quic: Any, withhold: bool, withheld: int) -> int:
        # Never below what was ever advertised: aioquic sets ``sent`` to 0 when a MAX_STREAMS
        # frame is lost (to send it again), and a limit lowered to that would make the peer's
        # next stream a STREAM_LIMIT_ERROR.
        limit = quic._local_max_streams_uni
        try:
            floor = quic._iac_advertised
        except AttributeError:  # (no getattr() call per flush)
            floor = 0
        if limit.sent > floor:
            floor = quic._iac_advertised = limit.sent
        else:
            quic._iac_advertised = floor
        if withhold:
            if limit.value > floor:
                withheld += limit.value - floor
                limit.value = floor
            return withheld
        if withheld:
            limit.value += withheld
        return 0

    def reassembly_bytes(quic: Any) -> int:
        # Data after a gap waits in the stream's receive buffer, the gap filled with zeros:
        # one small packet at a high offset makes aioquic allocate the whole gap.
        held = 0
        for stream in quic._streams.values():  # (a loop, not sum() of a generator: per flush)
            buffer = stream.receiver._buffer
            if buffer:  # (mostly empty: no len() call then)
                held += len(buffer)
        return held

    def limit_stream_window(quic: Any, nbytes: int) -> None:
        # What one fresh stream can make the library hold behind a gap (it doubles the
        # window as the stream's data arrives in order).
        quic._local_max_stream_data_uni = min(quic._local_max_stream_data_uni, nbytes)

    def uni_streams_finished(quic: Any, client: bool) -> bool:
        for sid, stream in quic._streams.items():
            if sid & 2 and bool(sid & 1) != client and not stream.sender.is_finished:
                return False
        return True

    def request_client_certificate(quic: Any) -> None:
        update = quic._update_traffic_key  # read by the TLS context when it is made

        def hooked(direction: Any, epoch: Any, cipher_suite: Any, secret: bytes) -> None:
            tls = quic.tls
            if direction == Direction.ENCRYPT and epoch == Epoch.HANDSHAKE:
                # the PSK is decided, the CertificateRequest not yet sent
                tls._request_client_certificate = not tls.session_resumed
            update(direction, epoch, cipher_suite, secret)

        quic._update_traffic_key = hooked

    def peer_certificate_chain(quic: Any) -> list[bytes]:
        tls = quic.tls
        if tls._peer_certificate is None:
            return []
        certs = [tls._peer_certificate, *tls._peer_certificate_chain]
        return [bytes(c.public_bytes(serialization.Encoding.DER)) for c in certs]

    def connection_tickets(quic: Any, fetch: Callable[[bytes], Any], add: Callable[[Any], None]) -> None:
        quic._session_ticket_fetcher = fetch
        quic._session_ticket_handler = add

    def initial_gate(server: Any, data: bytes) -> tuple[bool, bool]:
        if not data or not data[0] & 0x80:  # a short header: never an Initial (no parse per datagram)
            return False, False
        config = server._configuration
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=config.connection_id_length)
        except ValueError:
            return False, False
        new = (
            header.packet_type == QuicPacketType.INITIAL
            and len(data) >= SMALLEST_MAX_DATAGRAM_SIZE
            and header.version in config.supported_versions
            and header.destination_cid not in server._protocols
        )
        return new, bool(header.token)

    def set_retry(server: Any, on: bool) -> None:
        handler = getattr(server, "_iac_retry", None)
        if handler is None:
            handler = server._iac_retry = QuicRetryTokenHandler()
        server._retry = handler if on else None

    def attach_dialed(server: Any, proto: Any) -> Callable[[], None]:
        transport = server._transport
        if transport is None or transport.is_closing():
            raise ConfigError("the listener's socket is closed")
        proto.connection_made(transport)
        proto._connection_id_issued_handler = partial(server._connection_id_issued, protocol=proto)
        proto._connection_id_retired_handler = partial(server._connection_id_retired, protocol=proto)
        terminated = partial(server._connection_terminated, protocol=proto)
        proto._connection_terminated_handler = terminated
        server._protocols[proto._quic.host_cid] = proto
        return terminated

    def gso_socket(quic: Any, transport: Any) -> Any:
        # The library flushes through the asyncio transport's sendto; a train needs sendmsg,
        # which asyncio's socket wrapper (TransportSocket) does not offer: its socket, then.
        # uvloop's transport gives a PseudoSocket whose sendmsg takes no arguments: no GSO there.
        if not getattr(quic._configuration, "iac_gso", False) or transport is None:
            return None
        wrapper = transport.get_extra_info("socket")
        sock = getattr(wrapper, "_sock", wrapper)
        return sock if isinstance(sock, socket.socket) else None

    def ack_counter(quic: Any) -> Callable[[], int]:
        handlers = quic._QuicConnection__frame_handlers  # frame type -> (handler, epochs)
        seen = [0]
        for frame_type in (0x02, 0x03):  # ACK, ACK with ECN counts
            handle, epochs = handlers[frame_type]

            def counted(*args: Any, _handle: Any = handle) -> None:
                seen[0] += 1
                _handle(*args)

            handlers[frame_type] = (counted, epochs)
        return lambda: seen[0]

    def ack_settle(quic: Any) -> tuple[Callable[[], None], Callable[[], bool]]:
        # What the library may send after a flush comes from a datagram that asks for an ACK
        # or gives an event (the adapter flushes for those), a timer (which flushes), the
        # adapter's own writes (which ask for a flush), data or frames the congestion window
        # held back at the flush (noted here), and the frames of packets declared lost (counted
        # here: the library re-queues them, stream data, PINGs, credit, connection IDs alike).
        loss = quic._loss
        lost = loss._on_packets_lost
        settled = [False]

        def hooked(*, packets: Any, **kwargs: Any) -> None:
            packets = list(packets)
            if packets:  # (every acknowledgement looks for losses: mostly none)
                settled[0] = False
            lost(packets=packets, **kwargs)

        loss._on_packets_lost = hooked

        def flushed() -> None:
            cc = loss._cc
            settled[0] = cc.bytes_in_flight + quic._max_datagram_size <= cc.congestion_window

        return flushed, lambda: settled[0]

    def mark_stream_frames(quic: Any, protocol: Any) -> None:
        handlers = quic._QuicConnection__frame_handlers  # frame type -> (handler, epochs)
        for frame_type in range(0x08, 0x10):  # STREAM, with its OFF, LEN and FIN bits
            handle, epochs = handlers[frame_type]

            def marked(*args: Any, _handle: Any = handle) -> None:
                protocol._evented = True
                _handle(*args)

            handlers[frame_type] = (marked, epochs)

    pinned = str(aioquic.__version__).startswith(AIOQUIC_PINNED + ".")
    return Backend(
        ack_settle=ack_settle if pinned else None,
        mark_stream_frames=mark_stream_frames if pinned else None,
        pmtu=_aioquic_pmtu() if pinned else None,
        gso_socket=gso_socket,
        ack_counter=ack_counter if pinned else None,
        name="aioquic",
        version=str(aioquic.__version__),
        QuicConnectionProtocol=QuicConnectionProtocol,
        QuicConnection=QuicConnection,
        QuicConfiguration=QuicConfiguration,
        serve=serve,
        events=events,
        SessionTicket=SessionTicket,
        CipherSuite=CipherSuite,
        credit_control=True,
        load_certificates=load_certificates,
        peer_certificate_der=peer_certificate_der,
        remote_max_streams_uni=lambda quic: int(quic._remote_max_streams_uni),
        blocked_streams_uni=lambda quic: len(quic._streams_blocked_uni),
        ack_now=ack_now,
        withhold_credit=withhold_credit,
        uni_streams_finished=uni_streams_finished,
        is_closing=lambda quic: quic._state.name in ("CLOSING", "DRAINING", "TERMINATED"),
        zero_rtt_ready=lambda quic: bool(quic._cryptos[Epoch.ZERO_RTT].send.is_valid()),
        reassembly_bytes=reassembly_bytes,
        limit_stream_window=limit_stream_window,
        QuicServer=QuicServer,
        request_client_certificate=request_client_certificate if pinned else None,
        peer_certificate_chain=peer_certificate_chain if pinned else None,
        connection_tickets=connection_tickets if pinned else None,
        initial_gate=initial_gate if pinned else None,
        set_retry=set_retry if pinned else None,
        attach_dialed=attach_dialed if pinned else None,
        resets=_aioquic_resets() if pinned else None,
        ack_frequency=_aioquic_ack_frequency() if pinned else None,
        fast_padding=_aioquic_fast_padding if pinned else None,
    )


def _aioquic_fast_padding(quic: Any) -> None:
    """aioquic 1.7 reads a PADDING run one byte at a time in Python: 16,384 iterations for one
    path MTU probe (about a millisecond), 1,100 for a padded Initial. This handler in the
    connection's frame table (``_QuicConnection__frame_handlers``, type 0x00) skips the run
    in one C call, leaving the buffer where the library's would."""
    handlers = quic._QuicConnection__frame_handlers
    epochs = handlers[0x00][1]

    def on_padding(context: Any, frame_type: int, buf: Any) -> None:
        pos = buf.tell()
        rest = buf.data_slice(pos, buf.capacity)
        buf.seek(pos + len(rest) - len(rest.lstrip(b"\x00")))
        if quic._quic_logger is not None:
            context.quic_logger_frames.append(quic._quic_logger.encode_padding_frame())

    handlers[0x00] = (on_padding, epochs)


def _aioquic_resets() -> ResetHooks:
    """Stateless resets on aioquic :data:`AIOQUIC_PINNED` (it draws reset tokens with
    ``os.urandom``, and neither sends nor recognises resets): the tokens of
    ``QuicConnection._host_cids`` (set before the transport parameters or a
    NEW_CONNECTION_ID frame carry them, by wrapping ``_replenish_connection_ids``), the
    peer's in ``_peer_cid`` and the network paths' ``peer_cid``, the server's table of
    connection IDs (``QuicServer._protocols``), and the end without a packet (``_close_event``,
    ``_close_end``)."""
    from aioquic.quic import events
    from aioquic.quic.packet import QuicErrorCode

    def issue_tokens(quic: Any, token_of: Callable[[bytes], bytes]) -> None:
        def derive() -> None:
            for cid in quic._host_cids:
                if cid.stateless_reset_token is not None and not cid.was_sent:
                    cid.stateless_reset_token = token_of(cid.cid)

        first = quic._host_cids[0]
        if first.stateless_reset_token is not None:  # a server's: its transport parameters carry it
            first.stateless_reset_token = token_of(first.cid)
        replenish = quic._replenish_connection_ids

        def hooked() -> None:
            replenish()
            derive()

        quic._replenish_connection_ids = hooked

    def peer_tokens(quic: Any) -> list[bytes]:
        used = [quic._peer_cid, *(p.peer_cid for p in quic._network_paths)]
        return [c.stateless_reset_token for c in used if c is not None and c.stateless_reset_token]

    def owns(quic: Any, data: bytes) -> bool:
        dcid = data[1 : 1 + quic._configuration.connection_id_length]
        return any(c.cid == dcid for c in quic._host_cids)

    def unknown(server: Any, data: bytes) -> bytes | None:
        dcid = bytes(data[1 : 1 + server._configuration.connection_id_length])
        return None if dcid in server._protocols else dcid

    def protocols(server: Any) -> list[Any]:
        return list(set(server._protocols.values()))

    def drop(quic: Any) -> None:
        if quic._state.name in ("DRAINING", "TERMINATED"):
            return
        quic._close_event = events.ConnectionTerminated(
            error_code=QuicErrorCode.NO_ERROR, frame_type=None, reason_phrase="stateless reset"
        )
        quic._close_end()

    return ResetHooks(issue_tokens, peer_tokens, owns, unknown, protocols, drop)


def _aioquic_ack_frequency() -> Callable[[Any], AckFrequency | None]:
    """The ACK Frequency extension on aioquic :data:`AIOQUIC_PINNED`, which knows neither its
    transport parameter nor its frames. Each hook wraps a method of the one connection (an
    instance attribute, so other connections keep the library's): the transport parameters
    (``_serialize_transport_parameters`` appends ``min_ack_delay``, ``_parse_transport_parameters``
    reads the peer's), the frame table (``_QuicConnection__frame_handlers`` gains ACK_FREQUENCY
    and IMMEDIATE_ACK), the receiver's ACK deadline (``receive_datagram`` tells from the 1-RTT
    space's ``ack_at`` whether an ACK left since the last datagram and whether this one was
    ack-eliciting, and moves ``ack_at``, which the library's one timer follows) and the sender's
    frame (written after ``_write_connection_limits``, which runs for every 1-RTT packet the
    library builds, with the time ``datagrams_to_send`` was given: both hooked only from a
    datagram or a loss that moved the window or the RTT out of the latest frame's band until the
    next packet built; per packet, nothing otherwise); a 1-RTT loss probe's PING becomes
    IMMEDIATE_ACK (``_write_ping_frame``)."""
    from aioquic.quic.connection import EPOCHS, QuicConnectionError
    from aioquic.quic.packet import QuicFrameType, QuicPacketType
    from aioquic.quic.packet_builder import QuicDeliveryState
    from aioquic.tls import Epoch

    frame_room = 2 + 4 * 8  # the type and four varints at their longest

    def install(quic: Any) -> AckFrequency | None:
        settings = getattr(quic._configuration, "iac_ack_frequency", None)
        if not isinstance(settings, AckFrequencySettings) or not settings.enabled:
            return None
        state = AckFrequency()
        sender, receiver = state.sender, state.receiver
        quic._iac_ack_frequency = state  # path MTU probes carry IMMEDIATE_ACK when negotiated
        clock = [0.0]  # the time of the flush being built
        one_rtt: list[Any] = [None, None]  # the 1-RTT packet space, and the table it is from

        to_send = quic.datagrams_to_send
        write_limits = quic._write_connection_limits
        serialize = quic._serialize_transport_parameters
        quic._serialize_transport_parameters = lambda: serialize() + encode_min_ack_delay()

        parse = quic._parse_transport_parameters

        def parse_hooked(data: bytes, from_session_ticket: bool = False) -> None:
            parse(data, from_session_ticket=from_session_ticket)
            if from_session_ticket:  # a resumed session's old parameters: the handshake's decide
                return
            found = parse_min_ack_delay(data, float(quic._loss.max_ack_delay))
            if not isinstance(found, int) and found is not None:
                state.parameter_refused()
                raise QuicConnectionError(
                    error_code=found.code, frame_type=QuicFrameType.CRYPTO, reason_phrase=found.phrase
                )
            sender.on_peer_parameters(found, float(quic._loss.max_ack_delay))
            if found is None:  # the peer takes no frames: no hook per packet from now on
                quic.datagrams_to_send, quic._write_connection_limits = to_send, write_limits

        quic._parse_transport_parameters = parse_hooked

        def on_ack_frequency(context: Any, frame_type: int, buf: Any) -> None:
            fields = [buf.pull_uint_var() for _ in range(4)]
            refused = receiver.on_frame(AckFrequencyFrame(*fields))
            if refused is not None:
                raise QuicConnectionError(
                    error_code=refused.code, frame_type=frame_type, reason_phrase=refused.phrase
                )

        def on_immediate_ack(context: Any, frame_type: int, buf: Any) -> None:
            receiver.on_immediate_ack()

        handlers = quic._QuicConnection__frame_handlers
        handlers[ACK_FREQUENCY] = (on_ack_frequency, EPOCHS("01"))
        handlers[IMMEDIATE_ACK] = (on_immediate_ack, EPOCHS("01"))

        receive = quic.receive_datagram

        def receive_hooked(data: bytes, addr: Any, now: float) -> None:
            spaces = quic._spaces
            if one_rtt[1] is not spaces:  # (the table is made once, by the connect or first datagram)
                one_rtt[0], one_rtt[1] = spaces.get(Epoch.ONE_RTT), spaces
            space = one_rtt[0]
            if space is None:
                receive(data, addr, now=now)
                return
            before = space.largest_received_packet
            # The library clears ``ack_at`` when it writes an ACK (so one left since the last
            # datagram if ``ack_at`` is None and an ack-eliciting packet waited), and sets it for
            # an ack-eliciting packet only while it is None: cleared for the call, it says
            # whether this datagram's 1-RTT packet (the last in a datagram) was ack-eliciting,
            # and is put back after (no hook per packet or per ACK written).
            pending = space.ack_at
            space.ack_at = None
            try:
                receive(data, addr, now=now)
            finally:
                eliciting = space.ack_at is not None
                if pending is not None:  # (as the library keeps the first one)
                    space.ack_at = pending
            due = receiver.on_datagram(now, before, space.largest_received_packet, eliciting, pending is None)
            if due is not None and space.ack_at is not None:
                space.ack_at = due  # the library's timer follows it
            # The window and the RTT move only when a datagram (an acknowledgement) or a loss
            # arrives: the sender looks at its frame then, and only when they left the band in
            # which the last one stays (``sender.quiet``, written out).
            if sender.peer_min_ack_delay_us is not None:
                band = sender.band
                if band is None:
                    arm()
                else:
                    loss = quic._loss  # (every controller of 1.7 has ``congestion_window``)
                    packets = loss._cc.congestion_window // quic._max_datagram_size
                    if not (band[0] <= packets < band[1] and band[2] <= loss._rtt_smoothed <= band[3]):
                        arm()

        quic.receive_datagram = receive_hooked

        def arm() -> None:
            """Look at the frame in the next 1-RTT packet built (until then, the flush's time
            is kept); no per-packet hook otherwise."""
            quic.datagrams_to_send = to_send_hooked
            quic._write_connection_limits = write_limits_hooked

        def to_send_hooked(now: float) -> Any:
            clock[0] = now
            return to_send(now=now)

        def delivered(delivery: Any, sequence: int) -> None:
            if delivery == QuicDeliveryState.LOST:
                sender.on_lost(sequence)
                arm()

        def write_limits_hooked(builder: Any, space: Any) -> None:
            write_limits(builder=builder, space=space)
            if sender.peer_min_ack_delay_us is None:  # not negotiated (yet)
                return
            if builder.remaining_buffer_space < frame_room or builder.remaining_flight_space < frame_room:
                return
            quic.datagrams_to_send, quic._write_connection_limits = to_send, write_limits
            loss = quic._loss
            cwnd = int(getattr(loss._cc, "congestion_window", 0) or 0)
            frame = sender.poll(clock[0], cwnd, int(quic._max_datagram_size), float(loss._rtt_smoothed))
            if frame is None:
                return
            body = encode_frame(frame)
            buf = builder.start_frame(
                ACK_FREQUENCY, capacity=2 + len(body), handler=delivered, handler_args=(frame.sequence,)
            )
            buf.push_bytes(body)

        write_ping = quic._write_ping_frame

        def write_ping_hooked(builder: Any, uids: Sequence[int] = (), comment: str = "") -> None:
            # A loss probe (a PING the library sends at its probe timeout) carries IMMEDIATE_ACK
            # instead when the peer takes it: the peer would otherwise hold its ACK for the
            # requested delay, and the probe's ACK is what ends the timeout.
            if comment == "probe" and sender.negotiated and builder._packet_type == QuicPacketType.ONE_RTT:
                builder.start_frame(IMMEDIATE_ACK, capacity=1)
                sender.stats.probes_immediate += 1
                return
            write_ping(builder, list(uids), comment)

        quic._write_ping_frame = write_ping_hooked
        state.look = arm
        arm()
        return state

    return install


def _aioquic_pmtu() -> PmtuHooks:
    from aioquic._buffer import Buffer
    from aioquic.quic.connection import END_STATES
    from aioquic.quic.packet import QuicFrameType, QuicPacketType, pull_quic_transport_parameters
    from aioquic.quic.packet_builder import QuicDeliveryState, QuicPacketBuilder
    from aioquic.tls import Epoch, ExtensionType

    def handshake_confirmed(quic: Any) -> bool:
        return bool(quic._handshake_confirmed) and quic._state not in END_STATES

    def send_probe(quic: Any, size: int, now: float, done: Callable[[bool], None]) -> list[tuple[bytes, Any]]:
        crypto = quic._cryptos[Epoch.ONE_RTT]
        if not handshake_confirmed(quic) or not crypto.send.is_valid() or not quic._network_paths:
            return []
        path = quic._network_paths[0]
        if not path.is_validated:  # the anti-amplification limit holds: no probe beyond it
            return []
        builder = QuicPacketBuilder(
            host_cid=quic.host_cid,
            is_client=quic._is_client,
            max_datagram_size=size,
            packet_number=quic._packet_number,
            peer_cid=quic._peer_cid.cid,
            quic_logger=quic._quic_logger,
            spin_bit=quic._spin_bit,
            version=quic._version,
        )
        builder.start_packet(QuicPacketType.ONE_RTT, crypto)
        ackfreq = getattr(quic, "_iac_ack_frequency", None)
        builder.start_frame(  # a peer that delays its ACKs answers IMMEDIATE_ACK at once
            IMMEDIATE_ACK if ackfreq is not None and ackfreq.negotiated else QuicFrameType.PING,
            capacity=1,
            handler=lambda state: done(state == QuicDeliveryState.ACKED),
        )
        room = builder.remaining_buffer_space
        if room > 0:  # PADDING frames (a zero byte each) up to the size
            builder.start_frame(QuicFrameType.PADDING, capacity=room).push_bytes(bytes(room - 1))
        datagrams, packets = builder.flush()
        quic._packet_number = builder.packet_number
        space = quic._spaces[Epoch.ONE_RTT]
        for packet in packets:
            packet.sent_time = now
            # Not in flight: a lost probe says nothing about congestion (RFC 9000 section
            # 14.4), so it neither takes congestion window nor makes the controller back off.
            packet.in_flight = False
            quic._loss.on_packet_sent(packet=packet, space=space)
        path.bytes_sent += sum(len(d) for d in datagrams)
        return [(d, path.addr) for d in datagrams]

    def set_datagram_size(quic: Any, size: int) -> None:
        grown = size > quic._max_datagram_size
        quic._max_datagram_size = size
        loss = quic._loss
        loss._pacer._max_datagram_size = size
        cc = loss._cc
        for name in ("_max_datagram_size", "max_datagram_size", "additive_increase_factor"):
            if hasattr(cc, name):  # reno and cubic: the first (and cubic the last); BBR: the second
                setattr(cc, name, size)
        bbr = getattr(cc, "bbr", None)
        if bbr is not None:
            bbr.mds = size
        elif grown and hasattr(cc, "congestion_window"):
            # RFC 9002 section 7.2: the initial window recalculated with the new size (aioquic's
            # ten 1,200-byte packets are less than one 16,384-byte packet, and its pacer charges
            # every packet as a full one: small packets would wait about an RTT each)
            initial = min(10 * size, max(14720, 2 * size))
            if cc.congestion_window < initial:
                cc.congestion_window = initial
            if loss._rtt_initialized:
                loss._pacer.update_rate(
                    congestion_window=cc.congestion_window, smoothed_rtt=loss._rtt_smoothed
                )

    def watch_losses(quic: Any, on_loss: Callable[[int, float | None, float], None]) -> None:
        loss = quic._loss
        lost = loss._on_packets_lost

        def hooked(*, packets: Any, now: float, **kwargs: Any) -> None:
            packets = list(packets)
            if not packets:  # (every acknowledgement looks for losses: mostly none)
                lost(packets=packets, now=now, **kwargs)
                return
            largest = max((p.sent_bytes for p in packets if p.in_flight), default=0)
            lost(packets=packets, now=now, **kwargs)
            if largest:
                large = [p.sent_time for p in packets if p.in_flight and p.sent_bytes > 1200]
                on_loss(largest, max(large) if large else None, now)

        loss._on_packets_lost = hooked

    def watch_acks(quic: Any, on_acked: Callable[[int, float], None]) -> None:
        cc = quic._loss._cc
        acked = cc.on_packet_acked  # called by recovery for each acknowledged in-flight packet

        def hooked(*, now: float, packet: Any) -> None:
            acked(now=now, packet=packet)
            if packet.sent_bytes > 1200:
                on_acked(packet.sent_bytes, packet.sent_time)

        cc.on_packet_acked = hooked

    def peer_max_udp_payload(quic: Any) -> int | None:
        for ext_type, ext_data in quic.tls.received_extensions or ():
            if ext_type == ExtensionType.QUIC_TRANSPORT_PARAMETERS:
                params = pull_quic_transport_parameters(Buffer(data=ext_data))
                value = params.max_udp_payload_size
                return None if value is None else int(value)
        return None

    return PmtuHooks(
        send_probe=send_probe,
        set_datagram_size=set_datagram_size,
        watch_losses=watch_losses,
        watch_acks=watch_acks,
        peer_max_udp_payload=peer_max_udp_payload,
        probe_timeout=lambda quic: float(quic._loss.get_probe_timeout()),
        handshake_confirmed=handshake_confirmed,
        settings=lambda quic: getattr(quic._configuration, "iac_pmtud", None),
        largest=AIOQUIC_LARGEST_DATAGRAM,
    )


# --- qh3 2.x -------------------------------------------------------------------------------------


def _qh3() -> Backend:
    # Imported by name: qh3 is optional, so type checking must not depend on it.
    qh3 = importlib.import_module("qh3")
    protocol = importlib.import_module("qh3.asyncio.protocol")
    server = importlib.import_module("qh3.asyncio.server")
    events = importlib.import_module("qh3.quic.events")
    configuration = importlib.import_module("qh3.quic.configuration")
    connection = importlib.import_module("qh3.quic.connection")
    tls = importlib.import_module("qh3.tls")
    load_pem_x509_certificates = tls.load_pem_x509_certificates
    load_pem_private_key = tls.load_pem_private_key

    def load_certificates(chain_pem: bytes, key_pem: bytes) -> tuple[Any, Any, list[Any]]:
        certs = load_pem_x509_certificates(chain_pem)
        return certs[0], load_pem_private_key(key_pem), list(certs[1:])

    def peer_certificate_der(quic: Any) -> bytes | None:
        cert = quic.get_peercert()
        return None if cert is None else bytes(cert.public_bytes())

    def remote_max_streams_uni(quic: Any) -> int:
        core = quic._core
        return 0 if core is None else int(core.stream_limits[1])

    def uni_streams_finished(quic: Any, client: bool) -> bool:
        # Locally opened streams not yet terminal (every byte and the FIN acknowledged).
        core = quic._core
        return core is None or core.active_local_streams[1] == 0

    def ack_now(quic: Any, now: float) -> bool:
        # The native packet builder puts a pending ACK in every packet it sends.
        return False

    def withhold_credit(quic: Any, withhold: bool, withheld: int) -> int:
        # The native core grants MAX_STREAMS on its own; nothing to hold back.
        return 0

    return Backend(
        name="qh3",
        version=str(qh3.__version__),
        QuicConnectionProtocol=protocol.QuicConnectionProtocol,
        QuicConnection=connection.QuicConnection,
        QuicConfiguration=configuration.QuicConfiguration,
        serve=server.serve,
        events=events,
        SessionTicket=tls.SessionTicket,
        CipherSuite=tls.CipherSuite,
        credit_control=False,
        load_certificates=load_certificates,
        peer_certificate_der=peer_certificate_der,
        remote_max_streams_uni=remote_max_streams_uni,
        blocked_streams_uni=lambda quic: 0,  # the core refuses a stream beyond credit
        ack_now=ack_now,
        withhold_credit=withhold_credit,
        uni_streams_finished=uni_streams_finished,
        is_closing=lambda quic: quic._close_event is not None or quic._state.name == "TERMINATED",
        zero_rtt_ready=lambda quic: bool(quic._early_data_attempted),
        reassembly_bytes=lambda quic: 0,  # inside the native core, out of reach
        limit_stream_window=lambda quic, nbytes: None,
    )


_LOADERS: dict[str, Callable[[], Backend]] = {"aioquic": _aioquic, "qh3": _qh3}


# --- choice --------------------------------------------------------------------------------------


def installed(name: str) -> bool:
    """Whether backend ``name`` imports."""
    try:
        load(name)
    except ConfigError:
        return False
    return True


def available() -> list[str]:
    """The installed backends, in :data:`BACKENDS` order."""
    return [name for name in BACKENDS if installed(name)]


def set_backend(name: str | None) -> None:
    """Use backend ``name`` for listeners and dials started from now on (``None``:
    back to ``IAC_QUIC_BACKEND`` or the automatic choice). Raises ConfigError when
    ``name`` is unknown or not installed."""
    global _override
    if name is not None:
        load(name)
    _override = name


def selected_name() -> str:
    """The name :func:`get_backend` would load now."""
    if _override is not None:
        return _override
    env = os.environ.get(ENV_VAR, "").strip().lower()
    if env:
        return env
    for name in AUTO_ORDER:
        if installed(name):
            return name
    return AUTO_ORDER[0]


def get_backend(name: str | None = None) -> Backend:
    """Backend ``name``, else the selected one (see the module docstring)."""
    return load(name if name is not None else selected_name())


def load(name: str) -> Backend:
    backend = _cache.get(name)
    if backend is not None:
        return backend
    loader = _LOADERS.get(name)
    if loader is None:
        raise ConfigError(f"unknown QUIC backend {name!r} (choose one of {', '.join(BACKENDS)})")
    try:
        backend = loader()
    except ImportError as exc:
        hint = f" ({INSTALL_HINTS[name]})" if name in INSTALL_HINTS else ""
        raise ConfigError(f"QUIC backend {name!r} is not installed{hint}: {exc}") from None
    _cache[name] = backend
    return backend


__all__ = [
    "AIOQUIC_PINNED",
    "AUTO_ORDER",
    "BACKENDS",
    "ENV_VAR",
    "Backend",
    "PmtuHooks",
    "ResetHooks",
    "SessionTicketLike",
    "available",
    "get_backend",
    "installed",
    "load",
    "selected_name",
    "set_backend",
]
