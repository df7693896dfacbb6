"""Datagram packetization layer path MTU discovery (DPLPMTUD, RFC 8899) for one QUIC path, sans-IO.

A QUIC connection starts every path at :data:`BASE_PLPMTU` (1,200 bytes of UDP payload, the
size every QUIC path carries, RFC 9000 section 14) and this search probes upward: a probe is
one ack-eliciting packet of the candidate size (a PING padded with PADDING frames) and
carries no data, so that losing it costs nothing but the probe. The adapter
(:mod:`iac.transport.quic.protocol`, through the backend's :class:`~iac.transport.quic.backend.PmtuHooks`)
builds and sends it, reports whether it was acknowledged or lost, and lets packets grow to
:attr:`PathMtu.mtu` as soon as a probe of that size is acknowledged.

Search (RFC 8899 section 5.3): the first probe tries the configured maximum (the common
case: the path carries it, one round trip and done); a size whose probe is lost
:data:`MAX_PROBES` times in a row (or that the local interface refuses at once) is taken as
too large. The next candidate is the largest of :data:`PLATEAUS` (the sizes common links
carry: Ethernet's 1,500 bytes over IPv4 and IPv6, 9,000-byte jumbo frames) between the
largest acknowledged and the smallest failed size, so that a 1,500-byte path settles at
exactly 1,472 bytes; without one, the search halves that interval, until it is narrower than
:data:`SEARCH_GRANULARITY` bytes. Then the search is complete; it starts again after
:attr:`PathMtu.raise_interval` (RFC 8899's PMTU_RAISE_TIMER, 600 s), in case the path grew.

Black holes (RFC 8899 section 4.3): when a packet larger than the base is lost while the
path runs above the base (:meth:`PathMtu.on_large_loss`; a lost data packet or a probe
timeout of the connection's own loss recovery), the path is confirmed with a probe of the
current size. A confirmation probe acknowledged clears the suspicion (the loss was
congestion), and so does a data packet of the current size sent after the loss was noticed
and acknowledged (:meth:`PathMtu.on_large_acked`); :data:`MAX_PROBES` confirmation probes
lost in a row fall back to the base at once, so that a path whose MTU dropped moves data
again at most :data:`MAX_PROBES` probe timeouts after the first loss was noticed. A
fallen-back path searches again after ``raise_interval``.

One :class:`PathMtu` serves one network path: a connection that moves to a new path (a
NAT-punched one, a migration) calls :meth:`PathMtu.reset`, and the new path starts at the
base. Time is an argument everywhere; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from iac.errors import ConfigError

#: The UDP payload every QUIC path carries (RFC 9000 section 14), where every path starts.
BASE_PLPMTU = 1200
#: The largest UDP payload over IPv4 (65,535 less the IPv4 and UDP headers).
MAX_PLPMTU = 65527
#: The default largest size probed for (``TransportConfig.quic_max_datagram_size``): what
#: loopback carries with room to spare, and the most aioquic 1.7 can fill (its STREAM and
#: CRYPTO frames carry at most 16,383 bytes: a two-byte length); a 1,500-byte path stops
#: the search at :data:`ETHERNET_IPV4`.
DEFAULT_MAX_PLPMTU = 16384
#: A 1,500-byte IPv4 path (Ethernet) less 28 header bytes; and over IPv6, less 48.
ETHERNET_IPV4 = 1472
ETHERNET_IPV6 = 1452
#: A 9,000-byte jumbo-frame IPv4 path less 28 header bytes.
JUMBO_IPV4 = 8972
#: The sizes tried before halving, largest first (RFC 8899 section 5.3.2: a table of the
#: sizes links commonly carry).
PLATEAUS = (JUMBO_IPV4, ETHERNET_IPV4, ETHERNET_IPV6)
#: Lost probes of one size, in a row, that make the size too large (RFC 8899 MAX_PROBES).
MAX_PROBES = 3
#: The search stops once the largest acknowledged and the smallest failed size are this close.
SEARCH_GRANULARITY = 20
#: After a complete search (or a fall back), search again after this many seconds.
RAISE_INTERVAL = 600.0
#: A probe not acknowledged within this long is lost, whatever the adapter's timeout says.
MAX_PROBE_TIMEOUT = 10.0
#: ... and the shortest wait for one (a loopback RTT is microseconds; the peer's ACK delay is not).
MIN_PROBE_TIMEOUT = 0.05

#: :attr:`PathMtu.state` values.
DISABLED = "disabled"
SEARCHING = "searching"
COMPLETE = "complete"


@dataclass(frozen=True)
class PmtuSettings:
    """A connection's path MTU discovery settings (from ``TransportConfig.quic_pmtud`` and
    ``quic_max_datagram_size``)."""

    enabled: bool = True
    max_size: int = DEFAULT_MAX_PLPMTU


@dataclass
class PmtuStats:
    """What one path's search did (counted since the connection started, over its paths)."""

    probes_sent: int = 0
    probes_acked: int = 0
    probes_lost: int = 0
    #: Suspected black holes (a large packet lost) and the ones confirmed (fell back to the base).
    suspicions: int = 0
    fallbacks: int = 0
    #: Paths this connection searched (1 + the times :meth:`PathMtu.reset` was called).
    paths: int = 1
    #: The largest size a probe confirmed on any path (the base when none did).
    largest: int = BASE_PLPMTU
    #: The longest probe timeout used (seconds, after clamping).
    longest_timeout: float = 0.0
    #: When the last black hole was suspected, and when the path last fell back to the base.
    suspected_at: float | None = None
    fell_back_at: float | None = None


@dataclass
class _Probe:
    ident: int
    size: int
    sent_at: float
    deadline: float
    confirm: bool


class PathMtu:
    """The packet size one path allows, found by probing (see the module docstring).

    ``max_size``: the largest UDP payload probed for (at least :data:`BASE_PLPMTU`, at most
    :data:`MAX_PLPMTU`); ``enabled`` False keeps the path at the base and never probes.
    """

    def __init__(
        self,
        max_size: int = DEFAULT_MAX_PLPMTU,
        *,
        enabled: bool = True,
        max_probes: int = MAX_PROBES,
        granularity: int = SEARCH_GRANULARITY,
        raise_interval: float = RAISE_INTERVAL,
    ) -> None:
        if not BASE_PLPMTU <= max_size <= MAX_PLPMTU:
            raise ConfigError(f"max datagram size must be in [{BASE_PLPMTU}, {MAX_PLPMTU}], not {max_size}")
        if max_probes < 1 or granularity < 1 or not raise_interval > 0:
            raise ConfigError("max_probes and granularity must be at least 1, raise_interval positive")
        self.max_size = max_size
        self.enabled = enabled
        self.max_probes = max_probes
        self.granularity = granularity
        self.raise_interval = raise_interval
        self.stats = PmtuStats()
        #: The UDP payload packets on this path may use now.
        self.mtu = BASE_PLPMTU
        self.state = DISABLED
        self._lo = BASE_PLPMTU  # largest size known to pass
        self._hi = max_size + 1  # smallest size known to fail
        self._candidate = max_size
        self._losses = 0  # lost probes of the candidate (or confirmations), in a row
        self._confirming = False
        self._recheck = False  # a large packet sent after the confirmation probe was lost
        self._probe: _Probe | None = None
        self._next_id = 0
        self._search_at: float | None = None  # when a complete search starts again
        self._started = False

    # --- inputs -----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """The connection can send probes (its handshake is confirmed): begin the search."""
        if self._started:
            return
        self._started = True
        self._begin(now)

    def limit(self, peer_max: int | None) -> None:
        """The peer's ``max_udp_payload_size`` transport parameter: never probe above it."""
        if peer_max is None or peer_max >= self.max_size:
            return
        self.max_size = max(BASE_PLPMTU, peer_max)
        self._hi = min(self._hi, self.max_size + 1)
        self._candidate = min(self._candidate, self.max_size)
        if self.state == SEARCHING and self._hi - self._lo <= 1:
            self.state = COMPLETE

    def reset(self, now: float) -> None:
        """The connection moved to another path: back to the base, and search that path."""
        self.stats.paths += 1
        self.mtu = BASE_PLPMTU
        self._probe = None
        self._confirming = self._recheck = False
        if self._started:
            self._begin(now)

    def next_probe(self, now: float) -> int | None:
        """The size of the probe to send now, if one is due (at most one is outstanding)."""
        if self._probe is not None or not self._started or not self.enabled:
            return None
        if self._confirming:
            return self.mtu
        if self.state == COMPLETE and self._search_at is not None and now >= self._search_at:
            self._begin(now)
        if self.state == SEARCHING:
            return self._candidate
        return None

    def probe_sent(self, size: int, now: float, timeout: float) -> int:
        """A probe of ``size`` bytes left (``timeout``: how long its acknowledgement may take,
        clamped to [:data:`MIN_PROBE_TIMEOUT`, :data:`MAX_PROBE_TIMEOUT`]); returns its id."""
        self._next_id += 1
        wait = min(max(timeout, MIN_PROBE_TIMEOUT), MAX_PROBE_TIMEOUT)
        self.stats.longest_timeout = max(self.stats.longest_timeout, wait)
        self._probe = _Probe(self._next_id, size, now, now + wait, self._confirming and size == self.mtu)
        self.stats.probes_sent += 1
        return self._next_id

    def probe_acked(self, ident: int, now: float) -> None:
        """Probe ``ident`` was acknowledged: its size passes this path."""
        probe = self._probe
        if probe is None or probe.ident != ident:
            return  # a probe already given up on (or of a previous path)
        self._probe = None
        self.stats.probes_acked += 1
        self._losses = 0
        self.stats.largest = max(self.stats.largest, probe.size)
        if self._confirming and probe.size >= self.mtu:
            if self._recheck:  # lost after this probe left: the path may have changed since
                self._recheck = False
            else:
                self._confirming = False  # the path still carries its size: the loss was congestion
        if probe.size > self._lo:
            self._lo = probe.size
        if probe.size > self.mtu:
            self.mtu = probe.size
        if self.state == SEARCHING:
            self._step(now)

    def probe_lost(self, ident: int, now: float) -> None:
        """Probe ``ident`` was declared lost (or could not be sent: larger than the interface)."""
        probe = self._probe
        if probe is None or probe.ident != ident:
            return
        self._probe = None
        self.stats.probes_lost += 1
        self._losses += 1
        if probe.confirm:
            if self._losses >= self.max_probes:
                self._fall_back(now)
            return
        if self._losses >= self.max_probes and self.state == SEARCHING:
            self._hi = min(self._hi, probe.size)
            self._losses = 0
            self._step(now)

    def probe_refused(self, ident: int, now: float) -> None:
        """Probe ``ident`` could not leave (the local interface is smaller, EMSGSIZE): its size
        fails at once, without waiting for :data:`MAX_PROBES` losses."""
        probe = self._probe
        if probe is None or probe.ident != ident:
            return
        self._losses = self.max_probes - 1
        self.probe_lost(ident, now)

    def on_large_loss(self, now: float, sent_at: float | None = None) -> None:
        """A packet larger than the base (sent at ``sent_at``, the latest such packet of the
        loss) was lost on this path: confirm the current size."""
        if self.mtu <= BASE_PLPMTU or not self._started:
            return
        if self._confirming:
            probe = self._probe
            if probe is not None and (sent_at is None or sent_at >= probe.sent_at):
                self._recheck = True  # its acknowledgement would not clear this loss
            return
        self.stats.suspicions += 1
        self.stats.suspected_at = now
        self._confirming = True
        self._recheck = False
        self._losses = 0
        # A probe still out left before the loss was noticed: it may have passed before the
        # path changed, so only probes sent from now on confirm (or refute) the size.
        self._probe = None

    def on_large_acked(self, size: int, sent_at: float, now: float) -> None:
        """A data packet of ``size`` bytes, sent at ``sent_at``, was acknowledged: if it was sent
        after the suspicion began and is as large as the current size, the path still carries
        that size (the loss was congestion, such as a full receive buffer) and the suspicion ends."""
        if not self._confirming or size < self.mtu or self.stats.suspected_at is None:
            return
        if sent_at >= self.stats.suspected_at:
            self._confirming = self._recheck = False
            self._probe = None  # the confirmation probe still out proves nothing more
            self._losses = 0

    def on_timer(self, now: float) -> None:
        """The time reached :meth:`timer`: an outstanding probe expired."""
        probe = self._probe
        if probe is not None and now >= probe.deadline:
            self.probe_lost(probe.ident, now)

    def timer(self) -> float | None:
        """When :meth:`on_timer` (or :meth:`next_probe`) has something to do, if ever."""
        if self._probe is not None:
            return self._probe.deadline
        if self.state == COMPLETE and self._started and self.enabled:
            return self._search_at
        return None

    @property
    def probe_deadline(self) -> float | None:
        """When the outstanding probe counts as lost (None: no probe outstanding)."""
        return None if self._probe is None else self._probe.deadline

    # --- the search -------------------------------------------------------------------------

    @property
    def confirming(self) -> bool:
        """Whether a black hole is suspected and the current size is being confirmed."""
        return self._confirming

    def _begin(self, now: float) -> None:
        self._lo = self.mtu
        self._hi = self.max_size + 1
        self._losses = 0
        self._search_at = None
        if not self.enabled or self._hi - self._lo <= 1:
            self.state = COMPLETE if self.enabled else DISABLED
            self._search_at = None if not self.enabled else now + self.raise_interval
            return
        self.state = SEARCHING
        self._candidate = self.max_size

    def _step(self, now: float) -> None:
        """Pick the next candidate between the largest passed and the smallest failed size: the
        largest plateau in between, else the middle."""
        lo, hi = self._lo, self._hi
        if hi - lo <= self.granularity or hi - 1 <= lo:
            self.state = COMPLETE
            self._search_at = now + self.raise_interval
            return
        self._candidate = next((p for p in PLATEAUS if lo < p < hi), (lo + hi) // 2)

    def _fall_back(self, now: float) -> None:
        self.stats.fallbacks += 1
        self.stats.fell_back_at = now
        self._confirming = self._recheck = False
        self._losses = 0
        self.mtu = BASE_PLPMTU
        self._lo = BASE_PLPMTU
        self.state = COMPLETE
        self._search_at = now + self.raise_interval


__all__ = [
    "BASE_PLPMTU",
    "COMPLETE",
    "DEFAULT_MAX_PLPMTU",
    "DISABLED",
    "ETHERNET_IPV4",
    "ETHERNET_IPV6",
    "JUMBO_IPV4",
    "MAX_PLPMTU",
    "MAX_PROBES",
    "PLATEAUS",
    "SEARCHING",
    "SEARCH_GRANULARITY",
    "PathMtu",
    "PmtuSettings",
    "PmtuStats",
]
