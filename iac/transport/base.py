r"""The transport interface: configuration, addresses, and what every adapter offers.

An adapter (QUIC in :mod:`iac.transport.quic`, TLS/TCP in :mod:`iac.transport.tls`,
UNIX sockets in :mod:`iac.transport.unix`) turns a network connection into a
:class:`Connection` once the HELLO exchange verified, and accepts connections
with a :class:`Listener`. What a frame *means* is decided once for all of them
in :mod:`iac.transport.session`; the bounded queues between the application and
an adapter's I/O are in :mod:`iac.transport.queues`.

* :class:`TransportConfig`: every setting and bound, with its default.
* :class:`Address` and :func:`parse_address`: ``quic://``, ``tls://`` and ``unix://`` URLs.
* :class:`ConnectionTable` keeps one connection per peer pair.
* :func:`map_network_errors`: what the network raises under an adapter (``OSError``,
  ``ssl.SSLError``, ``EOFError``) becomes :class:`~iac.errors.TransportError` at this
  boundary (httpcore's ``map_exceptions``): a :class:`Connection`, a dial and a listener
  raise only :class:`~iac.errors.IacError`\ s.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ipaddress
import ssl
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from iac.errors import CloseCode, ConfigError, IacError, TransportError
from iac.protocol.clock import SYSTEM_CLOCK, Clock
from iac.protocol.handshake import DEFAULT_MAX_SKEW_US, HelloHook, instance_of
from iac.protocol.nonces import NonceCache, NonceStore
from iac.protocol.tickets import TicketStore
from iac.transport.bound import DEFAULT_MAX_CONNECTIONS, ConnectionBound
from iac.transport.budget import MemoryBudget
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.dicts import Dictionary, DictionarySet
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, Frame

MiB = 1024 * 1024
#: The URL schemes a node listens on and dials.
TRANSPORTS = ("quic", "tls", "unix")
#: ``TransportConfig.quic_retry``: when a QUIC listener validates addresses with Retry.
RETRY_MODES = ("auto", "always", "never")
#: QUIC congestion control algorithms (``TransportConfig.congestion``), and the default.
CONGESTION_CONTROLS = ("reno", "cubic", "bbr")
DEFAULT_CONGESTION = "reno"


@dataclass(frozen=True)
class TransportConfig:
    """Settings shared by every transport. All bounds are here, with their defaults.

    Timeouts are seconds. ``None`` for ``idle_timeout`` disables it.
    """

    #: Largest frame accepted (wire length and decompressed size); announced in HELLO.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: HELLO timestamps further than this from the local clock are refused.
    max_skew_us: int = DEFAULT_MAX_SKEW_US
    #: Transport setup (TCP/TLS/QUIC handshake) plus the HELLO exchange.
    handshake_timeout: float = 5.0
    #: A connection on which no frame moved either way for this long is closed (GOAWAY IDLE_TIMEOUT).
    idle_timeout: float | None = 30.0
    #: Liveness probes: TCP keep-alive idle time on TLS/TCP; on QUIC a PING after this long
    #: without a packet from the peer (the accepting side: a tenth of it twice more, at most 2 s).
    keepalive_interval: float = 10.0
    #: How long a QUIC peer has to answer a probe (a PING) before its connection is closed as
    #: dead: the probe of an old connection when the same key connects again (docs/PROTOCOL.md,
    #: "Duplicate connections"). Well above a path's RTT.
    probe_timeout: float = 2.5
    #: While something waits on a QUIC peer (requests, transfers, streams), probe it when it
    #: was not heard from for this long: a dead peer is found within this plus ``probe_timeout``.
    probe_interval: float = 0.5
    #: QUIC congestion control: "reno" (aioquic's default), "cubic", or "bbr" (paced, model
    #: based; aioquic backend only). TLS/TCP keeps the kernel's choice.
    congestion: str = DEFAULT_CONGESTION
    #: Send-side backpressure: ``send()`` waits while this many frames / bytes are queued.
    send_queue_frames: int = 1024
    send_queue_bytes: int = 8 * MiB
    #: Receive side: frames waiting for ``recv()``; reading stops while full.
    recv_queue_frames: int = 1024
    #: One connection's receive budget, in bytes *after decompression*: partly received
    #: frames (all streams of a connection), frames waiting for ``recv()`` (kept compressed,
    #: counted at their declared decompressed size) and the frames ``recv()`` handed out last
    #: (until the next ``recv()``). A connection whose budget is spent stops reading (QUIC:
    #: grants no new stream credit); a QUIC peer that sends more than this on the streams it
    #: already has is closed with BUFFER_EXCEEDED. At least ``max_frame_size``.
    recv_budget_bytes: int = 16 * MiB
    #: Node-wide cap on what all connections using this config hold on their receive side,
    #: counted as for ``recv_budget_bytes`` (one counter, ``memory_budget``, shared by the
    #: node's listeners and dials). A connection that cannot draw from it stops reading until
    #: readers take frames. At least ``recv_budget_bytes``. See docs/THREAT_MODEL.md,
    #: "Memory exhaustion".
    memory_budget_bytes: int = 256 * MiB
    #: Frames a side holds before the peer's HELLO verifies (QUIC uni streams can overtake
    #: it), kept compressed: at most this many frames and bytes (with partly received frames
    #: counted too, one ``max_frame_size`` more, for the HELLO); beyond: BUFFER_EXCEEDED.
    early_frames_limit: int = 256
    early_frames_bytes: int = DEFAULT_MAX_FRAME_SIZE
    #: How long a closing side waits for the peer to read its GOAWAY and hang up.
    linger_timeout: float = 1.0
    #: Dictionaries this side decodes (announced in HELLO, preferred first).
    dictionaries: DictionarySet = field(default_factory=DictionarySet)
    #: After the handshake, push the peer a dictionary derived from the negotiated one
    #: (its content plus this pair's Message prefixes) and compress with it once the peer
    #: acknowledged it; acknowledge the peer's pushes. False: neither push nor acknowledge
    #: (a pushed DICT is ignored, so the peer keeps the HELLO-negotiated dictionary).
    push_dictionaries: bool = True
    #: Announce ``elide/1`` in HELLO: toward a peer that announces it too, MESSAGE frames leave
    #: out the ``from``/``to`` prefix the HELLOs already proved (the receiver restores it before
    #: the signature check) and no per-peer dictionary is pushed, so a connection holds no
    #: derived dictionary of its own. Peers without it get full frames and pushed
    #: dictionaries. See docs/PROTOCOL.md, "Elided from/to".
    elide_prefixes: bool = True
    #: Announce ``elide-forward/1`` in HELLO: toward a peer that announces it too, a FORWARD
    #: carries the origin's AgentId once (32 raw bytes) instead of in ``path`` and the inner
    #: ``from``, and leaves out what the receiver knows (the sender at the end of ``path``, the
    #: inner ``to`` when it is the receiver); the receiver restores all of it before any check.
    #: See docs/PROTOCOL.md, "Compact Forwards".
    elide_forwards: bool = True
    #: Admission policy on the accepting side: AgentId -> admitted? None admits every
    #: authenticated peer (the default policy is open).
    admission: Callable[[str], bool] | None = None
    #: UNIX sockets: peer uids (SO_PEERCRED) accepted; None = only this process's uid.
    allowed_uids: frozenset[int] | None = None
    #: CA mode (TLS and QUIC): verify the peer's certificate chain against this CA;
    #: node certificate and key files (PEM). Without them a self-signed certificate
    #: is made at start and the channel binding secures the connection.
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Announced in HELLO.
    listen_addrs: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    #: Where time comes from (tests skew it).
    clock: Clock = SYSTEM_CLOCK
    #: The HELLO nonce cache (docs/PROTOCOL.md, "Nonce cache"), used by every listener given
    #: this config, so that a HELLO accepted on one transport is a replay on every other.
    #: None: a new in-memory :class:`~iac.protocol.nonces.NonceCache` is made here (copies made
    #: with ``dataclasses.replace`` keep sharing it). Servers that share session tickets
    #: (``ticket_store``) must share one too (:mod:`iac.stores.nonces`).
    nonce_cache: NonceStore | None = field(default=None, compare=False, repr=False)
    #: QUIC server session tickets (:class:`~iac.protocol.tickets.TicketStore`). None: each QUIC
    #: listener keeps its own in memory. A shared store (:mod:`iac.stores.tickets`) lets servers
    #: with one identity resume each other's sessions; see ``check_cluster_stores``.
    ticket_store: TicketStore | None = field(default=None, compare=False, repr=False)
    #: Per-source handshake limits, on every listener: a token bucket per source IP address
    #: (UNIX sockets: per peer uid) allows ``handshake_burst`` new connections at once and
    #: ``handshake_rate`` per second after that; more are refused before any signature is
    #: checked (QUIC: before the TLS handshake). The table keeps ``handshake_sources`` sources
    #: (the least recently seen is forgotten first). ``handshake_rate`` None: no limit.
    handshake_rate: float | None = 20.0
    handshake_burst: int = 40
    handshake_sources: int = 10_000
    #: Dial bursts: a listener runs at most ``handshake_concurrency`` handshakes (TLS/QUIC and
    #: HELLO) at once; new connections beyond wait, oldest first, in a queue of at most
    #: ``handshake_backlog`` (QUIC: each dial's first datagram, by source address and
    #: destination connection ID; TLS/TCP and UNIX: the accepted socket, before its HELLO
    #: exchange, and the ``listen(2)`` backlog is as large), so that a burst completes in
    #: order instead of every handshake slowing down until all time out. A queued QUIC
    #: connection starts at most 8 per event-loop turn. Over the backlog: dropped (QUIC: the
    #: client sends its Initial again) or refused ``busy``.
    handshake_concurrency: int = 32
    handshake_backlog: int = 4096
    #: Dial bursts, the dialing side: at most ``quic_dial_concurrency`` QUIC handshakes run at
    #: once per event loop; further dials wait their turn, oldest first, and their
    #: ``handshake_timeout`` starts when it comes (:mod:`iac.transport.quic.dialslots`), so
    #: that hundreds of dials started together do not stretch every handshake past its
    #: timeout. On paths with a long round trip, more in flight dial faster.
    quic_dial_concurrency: int = 8
    #: Also limit loopback addresses and UNIX-socket peers (local processes; off by default).
    handshake_limit_local: bool = False
    #: QUIC address validation (Retry, RFC 9000 section 8.1): "auto" sends Retry while more
    #: than ``retry_threshold`` new QUIC connections per second arrive at a listener (and for
    #: a few seconds after), "always" for every new connection, "never" not at all.
    quic_retry: str = "auto"
    retry_threshold: float = 200.0
    #: Test hook: rewrite this side's HELLO (forged HELLOs in the conformance tests).
    hello_hook: HelloHook | None = None
    #: Debugging: write a qlog file (for qvis) per QUIC connection into this directory
    #: (:mod:`iac.transport.debug`; session secrets go to ``SSLKEYLOGFILE`` when it is set).
    qlog_dir: str | None = None
    #: Connections the node's listeners hold at once, handshaking or open (all transports,
    #: one counter, ``connection_bound``, shared like ``memory_budget``); TLS/TCP and UNIX
    #: connections also stay below RLIMIT_NOFILE less 64. Over it a new connection is refused
    #: with ``busy`` (docs/IMPLEMENTATION.md, "Connection bound").
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    connection_bound: ConnectionBound | None = field(default=None, compare=False, repr=False)
    #: The counter behind ``memory_budget_bytes``. None: a new one is made; copies made with
    #: ``dataclasses.replace`` keep sharing it (unless they change ``memory_budget_bytes``).
    memory_budget: MemoryBudget | None = field(default=None, compare=False, repr=False)
    #: QUIC path MTU discovery (DPLPMTUD, RFC 8899; docs/PROTOCOL.md, "Path MTU"): every path
    #: starts at 1,200 bytes of UDP payload and probes upward to ``quic_max_datagram_size``;
    #: packets grow once a probe of their size was acknowledged, and fall back to 1,200 when
    #: the path stops carrying them. False: every packet stays at 1,200 bytes, no probes.
    quic_pmtud: bool = True
    #: The largest UDP payload probed for, 1,200..65,527 (default 16,384: loopback carries it,
    #: in one probe; a 1,500-byte path settles at 1,472 over IPv4 and 1,452 over IPv6, a
    #: 9,000-byte jumbo-frame LAN at 8,972). The aioquic backend probes at most 16,384 (the
    #: most its packets can fill), qh3 never probes.
    quic_max_datagram_size: int = 16384
    #: UDP segmentation offload (Linux ``UDP_SEGMENT``, detected at start; off elsewhere): a
    #: QUIC flush's train of same-size datagrams to one address leaves in one ``sendmsg``.
    quic_gso: bool = True
    #: QUIC ACK Frequency (docs/PROTOCOL.md, "ACK frequency"): offered with the transport
    #: parameter ``min_ack_delay``; to a peer that offers it too, a data sender asks for an ACK
    #: per half congestion window (2..64 packets) or per quarter RTT (at least 10 ms, within
    #: the peer's ``max_ack_delay``), and a receiver acknowledges as the peer asks. False
    #: (``--no-quic-ack-frequency`` on the command line): neither offered nor honoured.
    quic_ack_frequency: bool = True

    @property
    def connections(self) -> ConnectionBound:
        """The node-wide connection bound (``connection_bound``)."""
        if self.connection_bound is None:  # pragma: no cover - set in __post_init__
            raise ConfigError("TransportConfig without a connection bound")
        return self.connection_bound

    @property
    def memory(self) -> MemoryBudget:
        """The node-wide receive budget (``memory_budget``)."""
        if self.memory_budget is None:  # pragma: no cover - set in __post_init__
            raise ConfigError("TransportConfig without a memory budget")
        return self.memory_budget

    def __post_init__(self) -> None:
        if self.max_frame_size < 1024:
            raise ConfigError("max_frame_size must be at least 1024")
        if self.send_queue_frames < 1 or self.send_queue_bytes < 1:
            raise ConfigError("send queue bounds must be positive")
        if self.recv_queue_frames < 1 or self.recv_budget_bytes < self.max_frame_size:
            raise ConfigError("recv_budget_bytes must be at least max_frame_size")
        if self.memory_budget_bytes < self.recv_budget_bytes:
            raise ConfigError("memory_budget_bytes must be at least recv_budget_bytes")
        if self.early_frames_limit < 0 or self.early_frames_bytes < 0:
            raise ConfigError("early frame bounds must not be negative")
        if self.memory_budget is None or self.memory_budget.limit != self.memory_budget_bytes:
            object.__setattr__(self, "memory_budget", MemoryBudget(self.memory_budget_bytes))
        bound = self.connection_bound
        if bound is None or bound.max_connections != self.max_connections:
            object.__setattr__(self, "connection_bound", ConnectionBound(self.max_connections))
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("cert_file and key_file go together")
        if self.nonce_cache is None:
            object.__setattr__(self, "nonce_cache", NonceCache(self.max_skew_us))
        if self.handshake_rate is not None and (self.handshake_rate <= 0 or self.handshake_burst < 1):
            raise ConfigError("handshake_rate must be positive (or None) and handshake_burst at least 1")
        if self.handshake_concurrency < 1 or self.handshake_backlog < 0:
            raise ConfigError("handshake_concurrency must be at least 1 and handshake_backlog not negative")
        if self.quic_dial_concurrency < 1:
            raise ConfigError("quic_dial_concurrency must be at least 1")
        if self.handshake_sources < 1:
            raise ConfigError("handshake_sources must be at least 1")
        if self.quic_retry not in RETRY_MODES:
            raise ConfigError(f"quic_retry must be one of {', '.join(RETRY_MODES)}, not {self.quic_retry!r}")
        for name in ("probe_timeout", "probe_interval"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"{name} must be a positive, finite number of seconds")
        if self.retry_threshold <= 0:
            raise ConfigError("retry_threshold must be positive")
        if not 1200 <= self.quic_max_datagram_size <= 65527:
            raise ConfigError(
                f"quic_max_datagram_size must be in [1200, 65527], not {self.quic_max_datagram_size}"
            )
        if self.congestion not in CONGESTION_CONTROLS:
            raise ConfigError(
                f"congestion must be one of {', '.join(CONGESTION_CONTROLS)}, not {self.congestion!r}"
            )


@dataclass(frozen=True)
class PeerInfo:
    """Who is on the other side, as the HELLO proved it."""

    agent_id: str
    transport: str  # 'quic' | 'tls' | 'unix'
    address: str  # URL of the remote end ("tls://127.0.0.1:4433", "unix:///run/x.sock")
    hello: Hello
    resumed: bool = False  # QUIC: the session was resumed (0-RTT possible)
    dialed: bool = True  # this side dialed the connection


@dataclass(slots=True)
class Incoming:
    """One received MESSAGE or FORWARD frame, decoded (and decompressed) but not opened: the
    transport proves who the peer is (HELLO), never what a message says. The node's receive
    pipeline verifies the signature and that a MESSAGE's ``from`` is this connection's peer.
    Read-only by convention (one is made per frame: see :class:`~iac.wire.frames.Frame`)."""

    frame: Frame


#: What :meth:`Connection.serve` runs on each batch of received frames: True to go on reading.
BatchHandler = Callable[[list[Incoming]], Coroutine[Any, Any, bool]]


# --- errors at the boundary ---------------------------------------------------------------------

#: What the network raises under an adapter; translated at the boundary (:func:`map_network_errors`).
NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, ssl.SSLError, EOFError)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for a network error (just the type when it has no message)."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def network_error(what: str, exc: BaseException) -> TransportError:
    """The :class:`TransportError` that stands for network error ``exc`` during ``what``."""
    return TransportError(f"{what}: {describe_error(exc)}")


@contextlib.contextmanager
def map_network_errors(what: str) -> Iterator[None]:
    """Inside the block, a network error (:data:`NETWORK_ERRORS`) becomes a
    :class:`TransportError` naming ``what``, caused by it; library errors pass unchanged, and
    so does a :class:`TimeoutError` (the caller's own deadline, which it words itself)."""
    try:
        yield
    except TimeoutError:
        raise
    except NETWORK_ERRORS as exc:
        raise network_error(what, exc) from exc


class Connection(ABC):
    r"""One authenticated connection to one peer.

    ``send`` takes one encoded frame (``encode_frame`` / ``encode_message_frame``).
    ``recv`` returns the next MESSAGE or FORWARD frame; control frames are
    handled inside. After the connection closed, both raise the close error: a
    :class:`ConnectionClosed` carrying the close code and reason, or — for a
    handshake refusal that arrives after ``dial`` returned (UNIX, where the
    server's verdict on the client HELLO comes later) — the typed
    :class:`HandshakeError`. A connection raises only :class:`IacError`\ s: a network
    error under it is a :class:`TransportError` (:func:`map_network_errors`).
    """

    peer: PeerInfo
    local_hello: Hello
    #: 0-RTT (QUIC dials only): this side sent its HELLO and first frames as early data; whether
    #: the server accepted it, once the HELLOs verified (None before, and where it does not
    #: apply); called with that verdict when it comes after ``dial`` returned.
    early_data: bool = False
    early_data_accepted: bool | None = None
    on_early_outcome: Callable[[bool], None] | None = None

    @property
    def send_dictionary(self) -> Dictionary | None:
        """The dictionary this side pushed and the peer acknowledged: compress with it.
        None before the DICT_ACK (use the HELLO-negotiated one), and on adapters
        without pushed dictionaries (the adapters with them override this)."""
        return None

    def try_send(self, frame: bytes, *, early: bool = True) -> bool:
        """:meth:`send` when it needs no wait: True once ``frame`` is queued (and written as
        :meth:`send` writes it), False when only :meth:`send` can take it now (the queue is full,
        the frame must wait for the HELLO, or the adapter has no such path). Raises what
        :meth:`send` raises on a closed connection. The send path calls this first: a frame that
        needs no wait costs no coroutine."""
        return False

    @abstractmethod
    async def send(self, frame: bytes, *, early: bool = True) -> None:
        """Queue one frame. Waits while the send queue is full; frames queued in one
        event-loop turn are written together (TLS/TCP and UNIX: the first of a turn at once,
        those behind it at the end of the turn; the answers of a batch a reader runs in the
        receive callback when it ends). ``early=False``: on a connection whose HELLO
        went as 0-RTT early data, wait until the peer's HELLO verified, so that this frame
        never rides in early data (other connections ignore it)."""

    @abstractmethod
    async def recv(self) -> Incoming:
        """The next MESSAGE or FORWARD frame."""

    async def recv_many(self, limit: int) -> list[Incoming]:
        """Wait for the next frame, then take up to ``limit`` frames in all that are already
        received (a reader that handles frames in batches; order is kept)."""
        return [await self.recv()]

    async def serve(self, handle: BatchHandler, limit: int) -> None:
        """Hand every received frame, in order, to ``handle`` in batches (what is already
        received, up to ``limit``), one batch at a time, until ``handle`` returns False; raises
        what ``handle`` raises, or the close error once every frame was handed out. After each
        batch, what it queued to send is written (:meth:`flush`) and, with more frames waiting,
        the reader yields a loop turn to the other connections. The adapters run a batch right
        in their receive callback when it can finish there (:mod:`iac.transport.reader`): no
        task wake-up per batch; this default is a plain loop over :meth:`recv_many`."""
        while True:
            if not await handle(await self.recv_many(limit)):
                return
            self.flush()
            if self.received():
                await asyncio.sleep(0)

    def received(self) -> int:
        """Frames received and waiting for ``recv()``. A reader that yields to the other
        connections between batches need not when this is 0 (its next ``recv`` waits anyway).
        The adapters say how many their receive queue holds; a connection that cannot tell
        says 1."""
        return 1

    def flush(self) -> None:
        """Write what ``send`` queued now instead of at the end of the loop turn (a reader
        that answered a batch of frames: the answers leave one turn sooner). Adapters whose
        flush already follows the reader in the same turn ignore it."""
        return None

    @abstractmethod
    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        """Flush queued frames, send GOAWAY, close. Idempotent."""

    def watch(self, waiting: bool) -> None:
        """Whether something on this side waits on the peer (requests, transfers, streams): while
        it does, adapters that probe (QUIC) probe a peer not heard from for ``probe_interval``
        and close it if it does not answer within ``probe_timeout``. Others ignore it (the
        kernel reports a dead TCP peer)."""
        return None

    async def alive(self, bound: float) -> bool:
        """Whether the peer is alive: adapters that send their own probes (QUIC) probe it and
        wait at most ``bound`` seconds for the answer (a peer that does not answer is closed);
        on TLS/TCP and UNIX sockets the kernel reports a dead peer (a reset, TCP keep-alive),
        so an open connection is alive."""
        return not self.closed

    @abstractmethod
    async def wait_closed(self) -> None:
        """Return once the connection is closed, for whatever reason."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once closing has started."""

    @property
    @abstractmethod
    def close_error(self) -> IacError | None:
        """Why the connection closed (None while open)."""

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.peer.transport} {self.peer.agent_id[:16]}… {state}>"


class Listener(ABC):
    """Accepts connections; ``addresses`` are the URLs it is reachable at (ports resolved)."""

    addresses: list[str]

    @abstractmethod
    async def close(self) -> None:
        """Stop accepting and close every connection it accepted (GOAWAY GOING_AWAY)."""

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


#: What a listener calls with each accepted connection.
OnConnection = Callable[[Connection], Awaitable[None]]


# --- addresses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    """A parsed transport URL: ``quic://host:port``, ``tls://host:port``, ``unix:///path``."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def url(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        return f"{self.scheme}://{format_host(self.host)}:{self.port}"

    def __str__(self) -> str:
        return self.url


def format_host(host: str) -> str:
    """Brackets around an IPv6 literal."""
    return f"[{host}]" if ":" in host else host


def parse_address(url: str) -> Address:
    """Parse a transport URL; :class:`ConfigError` for anything else."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in TRANSPORTS:
        raise ConfigError(f"{url!r}: not a transport address (quic://h:p, tls://h:p, unix:///path)")
    if scheme == "unix":
        if not rest:
            raise ConfigError(f"{url!r}: a unix address needs a path")
        return Address("unix", path=rest)
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{url!r}: {exc}") from None
    if not host or port is None:
        raise ConfigError(f"{url!r}: needs host and port")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{url!r}: only scheme://host:port")
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    return Address(scheme, host=host, port=port)


# --- one connection per peer pair ---------------------------------------------------------------


class Verdict(enum.Enum):
    """What :meth:`ConnectionTable.verdict` says of a second connection with one peer key
    (docs/PROTOCOL.md, "Duplicate connections")."""

    NEW = "new"  #: the new one replaces the old one (close the old: GOING_AWAY)
    OLD = "old"  #: keep the old one (close the new: GOING_AWAY), the simultaneous-dial tie-break
    #: probe the old one (:meth:`Connection.alive`): dead, the new one replaces it; alive, the
    #: new one is refused: DUPLICATE_IDENTITY when it names another process, else GOING_AWAY
    PROBE = "probe"


class ConnectionTable:
    """One connection per peer. When two nodes dial each other at once, both end up
    with two connections; each side keeps the one dialed by the lower AgentId and
    closes the other (GOAWAY GOING_AWAY), so both keep the same one. A connection that
    the same side dialed again replaces the old one when both name one process; one that
    names another process (or none) replaces it only once a probe found it dead
    (:meth:`verdict`)."""

    def __init__(self, local_agent_id: str) -> None:
        self.local_agent_id = local_agent_id
        self._by_peer: dict[str, Connection] = {}

    def get(self, agent_id: str) -> Connection | None:
        conn = self._by_peer.get(agent_id)
        if conn is not None and conn.closed:
            del self._by_peer[agent_id]
            return None
        return conn

    def _dialer_of(self, conn: Connection) -> str:
        return self.local_agent_id if conn.peer.dialed else conn.peer.agent_id

    def verdict(self, old: Connection, new: Connection) -> Verdict:
        """Which of two verified connections with one peer key stays."""
        was, now = instance_of(old.peer.hello), instance_of(new.peer.hello)
        if was and now and was != now:
            return Verdict.PROBE  # another process proved the key: a restart, or a second process
        if old.peer.dialed == new.peer.dialed:  # the same side dialed again: it gave up on the old
            return Verdict.NEW if was and was == now else Verdict.PROBE
        return Verdict.NEW if self._tie_break(old, new) else Verdict.OLD

    def _tie_break(self, old: Connection, new: Connection) -> bool:
        lower = min(self.local_agent_id, new.peer.agent_id)
        return self._dialer_of(new) == lower and self._dialer_of(old) != lower

    def replace(self, old: Connection, new: Connection) -> bool:
        """Put ``new`` in ``old``'s place (False: ``old`` is not the peer's connection any more)."""
        peer = new.peer.agent_id
        if self._by_peer.get(peer) is not old:
            return False
        self._by_peer[peer] = new
        return True

    def add(self, conn: Connection) -> tuple[Connection, Connection | None]:
        """Register ``conn``; return ``(kept, to_close)``. The caller closes ``to_close``.
        A pair that needs a probe (:data:`Verdict.PROBE`) keeps the old one here: the caller
        probes first (:meth:`verdict`)."""
        old = self.get(conn.peer.agent_id)
        if old is None or old is conn:
            self._by_peer[conn.peer.agent_id] = conn
            return conn, None
        if self.verdict(old, conn) is Verdict.NEW and self.replace(old, conn):
            return conn, old
        lower = min(self.local_agent_id, conn.peer.agent_id)
        old_ok = self._dialer_of(old) == lower
        new_ok = self._dialer_of(conn) == lower
        if new_ok and not old_ok:
            self._by_peer[conn.peer.agent_id] = conn
            return conn, old
        return old, conn

    def remove(self, conn: Connection) -> None:
        if self._by_peer.get(conn.peer.agent_id) is conn:
            del self._by_peer[conn.peer.agent_id]

    def __len__(self) -> int:
        return len(self._by_peer)

    def connections(self) -> list[Connection]:
        return [c for c in self._by_peer.values() if not c.closed]

    def by_peer(self) -> Mapping[str, Connection]:
        """The open connections by peer AgentId, as a live read-only view: a lookup costs what a
        dict's does whatever the number of connections (a closed connection reads as absent), so
        a relay or a router asks it per frame; only iterating it walks every connection."""
        return _Open(self._by_peer)


class _Open(Mapping[str, Connection]):
    """:meth:`ConnectionTable.by_peer`: the table's dict, closed connections left out."""

    __slots__ = ("_by_peer",)

    def __init__(self, by_peer: dict[str, Connection]) -> None:
        self._by_peer = by_peer

    def __getitem__(self, peer: str) -> Connection:
        conn = self._by_peer[peer]
        if conn.closed:
            raise KeyError(peer)
        return conn

    def __iter__(self) -> Iterator[str]:
        return iter([p for p, c in self._by_peer.items() if not c.closed])  # a snapshot

    def __len__(self) -> int:
        return sum(1 for c in self._by_peer.values() if not c.closed)


__all__ = [
    "CONGESTION_CONTROLS",
    "DEFAULT_CONGESTION",
    "NETWORK_ERRORS",
    "RETRY_MODES",
    "TRANSPORTS",
    "Address",
    "BatchHandler",
    "Connection",
    "ConnectionTable",
    "Incoming",
    "Listener",
    "OnConnection",
    "PeerInfo",
    "TransportConfig",
    "Verdict",
    "describe_error",
    "format_host",
    "map_network_errors",
    "network_error",
    "parse_address",
]
