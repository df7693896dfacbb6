"""BBR (iac.transport.quic.congestion): the sans-IO core with a fake clock, the pacer, and two
aioquic connections over a simulated bottleneck (rate, bounded queue, delay, loss), all in
memory with an explicit clock. The last tests choose the algorithm through TransportConfig
and run it over loopback."""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from iac.errors import ConfigError
from iac.transport.base import TransportConfig
from iac.transport.certs import generate_self_signed
from iac.transport.quic import backend as quic_backend
from iac.transport.quic.congestion import attach, configure, library_algorithm
from iac.transport.quic.congestion.adapter import BbrCongestionControl
from iac.transport.quic.congestion.bbr import (
    HIGH_GAIN,
    MIN_CWND_PACKETS,
    MIN_RTT_WINDOW,
    PROBE_RTT_DURATION,
    Bbr,
    Mode,
)
from iac.transport.quic.congestion.pacer import Pacer
from iac.transport.quic.congestion.rate import WindowedMax

MDS = 1200


# --- a bottleneck: rate, bounded queue, one-way delay, random loss (pure, fake clock) ------------


class Bottleneck:
    """One direction of a link: a FIFO of ``queue_bytes`` drained at ``rate`` bytes/s, then
    ``delay`` seconds of propagation; random loss after the queue."""

    def __init__(self, rate: float, delay: float, queue_bytes: int, loss: float = 0.0, seed: int = 1) -> None:
        self.rate, self.delay, self.queue_bytes, self.loss = rate, delay, queue_bytes, loss
        self.rng = random.Random(seed)
        self.free_at = 0.0
        self.backlog: deque[tuple[float, int]] = deque()
        self.queued = 0
        self.dropped = 0
        self.lost = 0
        self.max_queued = 0
        self.blackout_until = -1.0  # drop everything before this time
        self.occupancy: list[tuple[float, int]] = []  # (time, bytes queued) at each arrival

    def admit(self, now: float, size: int) -> float | None:
        """When the packet arrives at the far end, or None when it is dropped."""
        while self.backlog and self.backlog[0][0] <= now:
            self.queued -= self.backlog.popleft()[1]
        self.occupancy.append((now, self.queued))
        if now < self.blackout_until:
            self.lost += 1
            return None
        if self.queued + size > self.queue_bytes:
            self.dropped += 1
            return None
        departure = max(now, self.free_at) + size / self.rate
        self.free_at = departure
        self.backlog.append((departure, size))
        self.queued += size
        self.max_queued = max(self.max_queued, self.queued)
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return None
        return departure + self.delay


# --- the core driven over a bottleneck, one ACK per packet --------------------------------------


@dataclass
class CoreRun:
    """A :class:`Bbr` sender and a :class:`Pacer` over a :class:`Bottleneck` (ACKs come back
    after ``delay`` without loss); ``app_rate`` limits the data the application offers."""

    rate: float
    rtt: float
    queue_bdp: float = 2.0
    loss: float = 0.0
    app_rate: float | None = None
    seed: int = 1
    bbr: Bbr = field(init=False)
    link: Bottleneck = field(init=False)
    pacer: Pacer = field(init=False)
    now: float = 100.0
    in_flight: int = 0
    modes: list[tuple[float, Mode]] = field(default_factory=list)
    bw_log: list[tuple[float, float]] = field(default_factory=list)
    sent_log: list[tuple[float, int]] = field(default_factory=list)
    delivered: int = 0
    extra_rtt: float = 0.0  # added to every ACK's path (a queue elsewhere)

    def __post_init__(self) -> None:
        self.bbr = Bbr(max_datagram_size=MDS, rng=random.Random(self.seed))
        bdp = self.rate * self.rtt
        self.link = Bottleneck(
            self.rate, self.rtt / 2, max(int(self.queue_bdp * bdp), 4 * MDS), self.loss, self.seed
        )
        self.pacer = Pacer(MDS)
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._app_credit = 0.0
        self._app_time = self.now
        self._wake: float | None = None
        self._ran_out = False
        self.bbr.on_rtt(self.now, self.rtt)  # the handshake's sample
        self.bbr.on_ack_done(self.now, 0)

    def _push(self, t: float, kind: str, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, data))

    def _app_has_data(self) -> bool:
        if self.app_rate is None:
            return True
        self._app_credit = min(self._app_credit + (self.now - self._app_time) * self.app_rate, 64 * MDS)
        self._app_time = self.now
        return self._app_credit >= MDS

    def _send(self) -> None:
        bbr = self.bbr
        while True:
            if self.in_flight + MDS > bbr.cwnd:
                return
            self.pacer.set_rate(self.now, bbr.pacing_rate)
            wait = self.pacer.next_send_time(self.now)
            if wait is not None:
                if self._wake is None or self._wake > wait:
                    self._wake = wait
                    self._push(wait, "wake")
                return
            if not self._app_has_data():
                bbr.on_app_limited(self.in_flight)
                self._ran_out = True
                if self.app_rate:
                    self._push(self.now + MDS / self.app_rate, "wake")
                return
            if self._ran_out:  # new data after running out: it goes out app-limited
                bbr.on_app_limited(self.in_flight)
                self._ran_out = False
            if self.app_rate is not None:
                self._app_credit -= MDS
            snap = bbr.on_sent(self.now, MDS, self.in_flight)
            self.in_flight += MDS
            self.pacer.on_sent(self.now, MDS)
            self.sent_log.append((self.now, MDS))
            arrival = self.link.admit(self.now, MDS)
            if arrival is None:  # detected as lost about one RTT later
                self._push(self.now + 1.125 * (self.rtt + self.extra_rtt), "lost", snap)
            else:
                self._push(arrival + self.rtt / 2 + self.extra_rtt, "ack", snap)

    def run(self, duration: float) -> None:
        end = self.now + duration
        self._send()
        while self._events and self._events[0][0] <= end:
            t, _, kind, snap = heapq.heappop(self._events)
            self.now = t
            bbr = self.bbr
            if kind == "wake":
                if self._wake is not None and self._wake <= t:
                    self._wake = None
            elif kind == "ack":
                bbr.on_acked(t, snap, self.in_flight)
                self.in_flight -= snap.size
                self.delivered += snap.size
                bbr.on_rtt(t, t - snap.sent_time)
                bbr.on_ack_done(t, self.in_flight)
            elif kind == "lost":
                bbr.on_lost(t, snap, self.in_flight)
                self.in_flight -= snap.size
                bbr.on_ack_done(t, self.in_flight)
            if not self.modes or self.modes[-1][1] is not bbr.mode:
                self.modes.append((t, bbr.mode))
            if kind == "ack":
                self.bw_log.append((t, bbr.bw))
            self._send()
        self.now = end


# --- the core ---------------------------------------------------------------------------------------


def test_windowed_max_keeps_the_largest_of_the_last_rounds() -> None:
    f = WindowedMax(10)
    for r, v in enumerate([5.0, 3.0, 4.0, 1.0, 2.0]):
        f.update(r, v)
    assert f.best == 5.0
    f.update(9, 0.5)
    assert f.best == 5.0  # round 0 is still inside rounds 0..9
    f.update(10, 0.5)
    assert f.best == 4.0  # round 0 left the window; 4.0 (round 2) is the largest left
    f.update(13, 0.1)
    assert f.best == 2.0
    f.update(13, 0.3)  # same round, smaller than what the round has: no new entry
    assert len(f) <= 3
    f.update(30, 0.2)
    assert f.best == 0.2 and len(f) == 1
    for r in range(100, 200):  # one entry per round at most
        for v in (3.0, 2.0, 1.0):
            f.update(r, v + r)
    assert len(f) <= 10


def _bdp(rate: float, rtt: float) -> float:
    return rate * rtt


def test_startup_drain_probe_bw_and_the_model_matches_the_path() -> None:
    rate, rtt = 1.25e6, 0.04  # 10 Mbit/s, 40 ms
    run = CoreRun(rate, rtt, queue_bdp=4.0)
    run.run(5.0)
    modes = [m for _, m in run.modes]
    assert modes[:3] == [Mode.STARTUP, Mode.DRAIN, Mode.PROBE_BW]
    assert run.bbr.full_bw_reached
    assert run.bbr.bw == pytest.approx(rate, rel=0.1)
    assert run.bbr.min_rtt == pytest.approx(rtt + MDS / rate, rel=0.05)
    # STARTUP ends within a dozen round trips and DRAIN within a few more
    startup_end = next(t for t, m in run.modes if m is Mode.DRAIN) - 100.0
    drain_end = next(t for t, m in run.modes if m is Mode.PROBE_BW) - 100.0
    assert startup_end < 14 * rtt and drain_end - startup_end < 4 * rtt
    # the gain cycle: every phase of 8 shows up, one min_rtt each
    assert run.bbr.mode is Mode.PROBE_BW
    # link kept busy: at least 90 % of the capacity after STARTUP
    assert run.delivered / 5.0 >= 0.9 * rate
    # and the queue stays well below what loss-based control would build (4 BDP here)
    assert run.link.max_queued < 2.5 * _bdp(rate, rtt)


def test_probe_bw_cycles_through_the_eight_gains() -> None:
    run = CoreRun(1.25e6, 0.02, queue_bdp=4.0)
    seen: list[float] = []
    run.run(1.0)
    for _ in range(200):
        run.run(0.01)
        if not seen or seen[-1] != run.bbr.pacing_gain:
            seen.append(run.bbr.pacing_gain)
    i = seen.index(1.25)
    assert seen[i : i + 3] == [1.25, 0.75, 1.0]
    assert seen.count(1.25) >= 2  # a cycle is 8 min_rtt = 160 ms; 2 s hold several


def test_app_limited_samples_do_not_lower_the_estimate() -> None:
    rate, rtt = 1.25e6, 0.02
    run = CoreRun(rate, rtt, queue_bdp=2.0)
    run.run(2.0)
    bw = run.bbr.bw
    assert bw == pytest.approx(rate, rel=0.1)
    run.app_rate = rate / 10  # the application now offers a tenth of the path
    run._app_time = run.now
    run.run(3.0)  # 150 round trips: far beyond the filter's 10
    assert run.bbr.bw >= 0.9 * bw
    # ... while samples that are not app-limited would have lowered it
    assert run.delivered > 0


def test_bandwidth_drop_is_followed_within_the_filter_window() -> None:
    rate, rtt = 1.25e6, 0.02
    run = CoreRun(rate, rtt, queue_bdp=2.0)
    run.run(2.0)
    run.link.rate = rate / 2  # the bottleneck halves
    run.run(1.0)  # 50 round trips > 10 (the filter's window)
    assert run.bbr.bw == pytest.approx(rate / 2, rel=0.15)


def test_min_rtt_expires_and_probe_rtt_drains_the_queue() -> None:
    rate, rtt = 1.25e6, 0.02
    run = CoreRun(rate, rtt, queue_bdp=8.0)
    run.run(1.0)
    first = run.bbr.min_rtt
    run.extra_rtt = 0.01  # from now on every RTT is 10 ms longer: min_rtt is not refreshed
    run.run(MIN_RTT_WINDOW + 0.5)
    probe = [t for t, m in run.modes if m is Mode.PROBE_RTT]
    assert probe, "PROBE_RTT was never entered"
    entered = probe[0] - 100.0
    assert 1.0 + 0.5 * MIN_RTT_WINDOW <= entered <= 1.0 + MIN_RTT_WINDOW + 0.1
    # in PROBE_RTT the window is 4 packets, for PROBE_RTT_DURATION and a round trip
    after = [(t, m) for t, m in run.modes if t >= probe[0]]
    left = next(t for t, m in after if m is not Mode.PROBE_RTT)
    assert PROBE_RTT_DURATION <= left - probe[0] <= PROBE_RTT_DURATION + 6 * (rtt + 0.01)
    assert run.bbr.mode is Mode.PROBE_BW
    # the min RTT filter took the new (longer) path RTT after its window expired
    assert run.bbr.min_rtt > first


def test_probe_rtt_holds_the_window_at_four_packets() -> None:
    run = CoreRun(1.25e6, 0.02, queue_bdp=4.0)
    run.run(1.0)
    bbr = run.bbr
    run.extra_rtt = 0.005
    cwnds = []
    for _ in range(1200):
        run.run(0.01)
        if bbr.mode is Mode.PROBE_RTT:
            cwnds.append(bbr.cwnd)
    assert cwnds and max(cwnds) <= MIN_CWND_PACKETS * MDS


def test_random_loss_does_not_collapse_the_rate() -> None:
    rate, rtt = 1.25e6, 0.04
    run = CoreRun(rate, rtt, queue_bdp=1.0, loss=0.02, seed=3)
    run.run(6.0)
    assert run.link.lost > 50
    assert run.delivered / 6.0 >= 0.75 * rate  # a loss-based sender gets a fraction of this
    assert run.bbr.bw == pytest.approx(rate, rel=0.15)


def test_recovery_conserves_packets_then_restores_the_window() -> None:
    bbr = Bbr(max_datagram_size=MDS, rng=random.Random(1))
    now, rtt = 10.0, 0.02
    bbr.on_rtt(now, rtt)
    bbr.on_ack_done(now, 0)
    # bring it to steady state by hand: 100 packets per round trip
    in_flight, sent = 0, deque()
    for _ in range(3000):
        now += rtt / 100
        sent.append(bbr.on_sent(now, MDS, in_flight))
        in_flight += MDS
        if len(sent) > 100:
            snap = sent.popleft()
            bbr.on_acked(now, snap, in_flight)
            in_flight -= MDS
            bbr.on_rtt(now, rtt)
            bbr.on_ack_done(now, in_flight)
    cwnd = bbr.cwnd
    assert bbr.mode is Mode.PROBE_BW and cwnd >= 150 * MDS
    # a loss: packet conservation for one round trip
    lost = sent.popleft()
    bbr.on_lost(now, lost, in_flight)
    in_flight -= MDS
    snap = sent.popleft()
    bbr.on_acked(now, snap, in_flight)
    in_flight -= MDS
    bbr.on_ack_done(now, in_flight)
    assert bbr.in_recovery
    assert bbr.cwnd <= in_flight + 2 * MDS
    # an ACK of a packet sent after the loss ends the episode: the window comes back
    for _ in range(150):
        now += rtt / 100
        sent.append(bbr.on_sent(now, MDS, in_flight))
        in_flight += MDS
        snap = sent.popleft()
        bbr.on_acked(now, snap, in_flight)
        in_flight -= MDS
        bbr.on_ack_done(now, in_flight)
    assert not bbr.in_recovery
    assert bbr.cwnd >= 0.95 * cwnd


def test_persistent_congestion_drops_to_the_minimum_then_restores() -> None:
    run = CoreRun(1.25e6, 0.02)
    run.run(1.0)
    bbr = run.bbr
    before = bbr.cwnd
    bbr.on_persistent_congestion(run.now)
    assert bbr.cwnd == MIN_CWND_PACKETS * MDS
    run.run(0.5)
    assert bbr.cwnd >= 0.8 * before


def test_initial_pacing_rate_comes_from_the_first_rtt() -> None:
    bbr = Bbr(max_datagram_size=MDS)
    bbr.on_rtt(1.0, 0.05)
    assert bbr.pacing_rate == pytest.approx(HIGH_GAIN * 10 * MDS / 0.05)
    assert bbr.cwnd == 10 * MDS


def test_idle_restart_paces_at_the_estimate() -> None:
    run = CoreRun(1.25e6, 0.02)
    run.run(2.0)
    bbr = run.bbr
    assert run.in_flight > 0
    run.app_rate = 0.0  # the application stops
    run._app_time = run.now
    run.run(1.0)
    assert run.in_flight == 0
    bbr.on_sent(run.now, MDS, 0)
    assert bbr.idle_restart
    if bbr.mode is Mode.PROBE_BW:
        assert bbr.pacing_rate == pytest.approx(bbr.bw * 0.99)


def test_rate_sample_ignores_intervals_shorter_than_min_rtt() -> None:
    bbr = Bbr(max_datagram_size=MDS)
    bbr.on_rtt(1.0, 0.05)
    bbr.on_ack_done(1.0, 0)
    snaps = [bbr.on_sent(1.0, MDS, i * MDS) for i in range(10)]
    for s in snaps:  # all acknowledged 1 ms later: an impossible 12 MB/s
        bbr.on_acked(1.001, s, 10 * MDS)
    bbr.on_ack_done(1.001, 0)
    assert bbr.bw == 0.0


# --- the pacer ---------------------------------------------------------------------------------------


def _max_in_window(log: list[tuple[float, int]], window: float) -> int:
    best, total, j = 0, 0, 0
    for t, size in log:
        total += size
        while log[j][0] < t - window + 1e-12:
            total -= log[j][1]
            j += 1
        best = max(best, total)
    return best


@pytest.mark.parametrize("rate", [2e5, 1.25e6, 6.25e6, 2.5e7])
def test_pacer_bound_over_any_window_with_late_timers(rate: float) -> None:
    """Whatever the timers' lateness, bytes in W <= rate W + max(2 datagrams, rate x 1 ms)."""
    rng = random.Random(int(rate))
    pacer = Pacer(MDS, rate)
    now, log = 0.0, []
    while now < 2.0:
        wait = pacer.next_send_time(now)
        if wait is None:
            size = rng.choice([MDS, MDS, MDS, 600])
            pacer.on_sent(now, MDS)
            pacer.refund(MDS - size)
            log.append((now, size))
            continue
        # asyncio's tick: the timer fires up to 2 ms late, sometimes much later
        now = wait + rng.choice([0.0, 0.0005, 0.001, 0.002, rng.uniform(0, 0.02)])
    quantum = max(2 * MDS, rate * 0.001)
    for window in (0.002, 0.005, 0.02, 0.1, 1.0):
        assert _max_in_window(log, window) <= rate * window + quantum + 1


@pytest.mark.parametrize("rate", [2e5, 1.25e6, 6.25e6, 2.5e7])
def test_pacer_keeps_the_rate_when_timers_tick_at_1_ms(rate: float) -> None:
    rng = random.Random(7)
    pacer = Pacer(MDS, rate)
    now, sent = 0.0, 0
    while now < 2.0:
        wait = pacer.next_send_time(now)
        if wait is None:
            pacer.on_sent(now, MDS)
            sent += MDS
            continue
        now = math.ceil(wait * 1000) / 1000 + rng.uniform(0, 0.0002)  # the next tick, a bit late
    assert sent >= 0.8 * rate * 2.0


def test_pacer_rate_change_does_not_release_a_burst() -> None:
    pacer = Pacer(MDS, 1e5)
    pacer.next_send_time(0.0)
    pacer.set_rate(10.0, 1e7)  # long idle at a low rate, then a high rate
    sent = 0
    while pacer.next_send_time(10.0) is None:
        pacer.on_sent(10.0, MDS)
        sent += MDS
    assert sent <= max(2 * MDS, 1e7 * 0.001)


# --- two aioquic connections over a simulated bottleneck ----------------------------------------------


_CERT = generate_self_signed("bbr-test")


def _configs(cc: str) -> tuple[QuicConfiguration, QuicConfiguration]:
    client = QuicConfiguration(is_client=True, alpn_protocols=["t"], idle_timeout=60.0)
    client.verify_mode = 0
    server = QuicConfiguration(is_client=False, alpn_protocols=["t"], idle_timeout=60.0)
    server.certificate = x509.load_pem_x509_certificate(_CERT.cert_pem)
    server.private_key = serialization.load_pem_private_key(_CERT.key_pem, None)
    aioquic = quic_backend.load("aioquic")
    configure(client, cc, aioquic)
    configure(server, cc, aioquic)
    return client, server


class _Endpoint:
    def __init__(self, quic: QuicConnection, addr: tuple[str, int]) -> None:
        self.quic = quic
        self.addr = addr
        self.hooks = attach(quic, quic_backend.load("aioquic"))
        self.timer_at: float | None = None
        self.timer_gen = 0
        self.received = 0
        self.timeline: list[tuple[float, int]] = []
        self.connected = False


class QuicLink:
    """A client sending ``total`` bytes on one stream to a server through :class:`Bottleneck`s,
    with a fake clock; timers fire on a ``tick`` grid as asyncio's do."""

    def __init__(
        self,
        cc: str,
        *,
        rate: float = 1.25e6,
        rtt: float = 0.02,
        queue_bdp: float = 2.0,
        loss: float = 0.0,
        seed: int = 1,
        total: int = 4_000_000,
        tick: float = 0.001,
    ) -> None:
        ccfg, scfg = _configs(cc)
        self.now = 1000.0
        self.tick = tick
        self.total = total
        queue = max(int(queue_bdp * rate * rtt), 8 * MDS)
        self.up = Bottleneck(rate, rtt / 2, queue, loss, seed)
        self.down = Bottleneck(rate, rtt / 2, queue, loss, seed + 1)
        self.client = _Endpoint(QuicConnection(configuration=ccfg), ("10.0.0.1", 1))
        self.server = _Endpoint(
            QuicConnection(
                configuration=scfg,
                original_destination_connection_id=self.client.quic.original_destination_connection_id,
            ),
            ("10.0.0.2", 2),
        )
        self.sent_log: list[tuple[float, int, float]] = []  # (time, in-flight bytes, pacing rate)
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.stream_id: int | None = None
        self.client.quic.connect(self.server.addr, now=self.now)
        self._transmit(self.client)

    def _push(self, t: float, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, data))

    def _fire_time(self, when: float) -> float:
        if when <= self.now:  # a timer in the past fires on the next turn of the loop
            return self.now + 1e-6
        return self.now + math.ceil((when - self.now) / self.tick - 1e-9) * self.tick

    def _transmit(self, ep: _Endpoint) -> None:
        quic = ep.quic
        if ep.hooks is not None:
            ep.hooks.before_transmit(self.now)
        datagrams = quic.datagrams_to_send(now=self.now)
        if ep is self.client and datagrams:
            cc = quic._loss._cc
            sent = (
                cc.sent_in_flight
                if isinstance(cc, BbrCongestionControl)
                else sum(len(d) for d, _ in datagrams)
            )
            rate = cc.bbr.pacing_rate if isinstance(cc, BbrCongestionControl) else 0.0
            if sent:
                self.sent_log.append((self.now, sent, rate))
        if ep.hooks is not None:
            ep.hooks.after_transmit(self.now)
        link, peer = (self.up, self.server) if ep is self.client else (self.down, self.client)
        for data, _ in datagrams:
            arrival = link.admit(self.now, len(data) + 28)  # + IP and UDP headers
            if arrival is not None:
                self._push(arrival, "datagram", (peer, data))
        timer = quic.get_timer()
        if timer != ep.timer_at:
            ep.timer_at = timer
            ep.timer_gen += 1
            if timer is not None:
                self._push(self._fire_time(timer), "timer", (ep, ep.timer_gen))

    def _events_of(self, ep: _Endpoint) -> None:
        while (ev := ep.quic.next_event()) is not None:
            if isinstance(ev, events.HandshakeCompleted) and ep is self.client:
                ep.connected = True
                self.stream_id = ep.quic.get_next_available_stream_id()
                ep.quic.send_stream_data(self.stream_id, b"\0" * self.total, end_stream=True)
            elif isinstance(ev, events.StreamDataReceived):
                ep.received += len(ev.data)
                ep.timeline.append((self.now, ep.received))

    def run(self, until: float) -> None:
        end = self.now + until if until < 1000 else until
        while self._events and self._events[0][0] <= end:
            t, _, kind, data = heapq.heappop(self._events)
            self.now = t
            if kind == "datagram":
                ep, payload = data
                ep.quic.receive_datagram(
                    payload, (self.client if ep is self.server else self.server).addr, now=t
                )
            else:
                ep, gen = data
                if gen != ep.timer_gen:
                    continue
                ep.timer_at = None
                ep.timer_gen += 1
                ep.quic.handle_timer(now=t)
            self._events_of(ep)
            self._transmit(ep)
            if self.server.received >= self.total:
                break
        self.now = max(self.now, end) if self.server.received < self.total else self.now

    def goodput(self, start: float, stop: float) -> float:
        """Bytes/s the server application received between ``start`` and ``stop`` (absolute)."""

        def at(t: float) -> int:
            got = 0
            for when, total in self.server.timeline:
                if when > t:
                    break
                got = total
            return got

        return (at(stop) - at(start)) / (stop - start)


def test_aioquic_bbr_paces_within_the_bound() -> None:
    link = QuicLink("bbr", rate=6.25e6, rtt=0.02, queue_bdp=2.0, total=8_000_000)
    link.run(3.0)
    assert link.server.received >= 4_000_000
    log = link.sent_log
    assert log
    for window in (0.002, 0.005, 0.02, 0.1):
        j, total = 0, 0
        for t, size, _ in log:
            total += size
            while log[j][0] < t - window + 1e-12:
                total -= log[j][1]
                j += 1
            rate = max(r for tt, _, r in log[j:] if tt <= t)
            allowed = rate * window + max(2 * MDS, rate * 0.001)
            assert total <= allowed + 1, (window, t, total, allowed)


@pytest.mark.parametrize("loss", [0.0, 0.01])
def test_aioquic_bbr_fills_the_link_and_beats_cubic_under_loss(loss: float) -> None:
    rate, rtt = 1.25e6, 0.04
    got = {}
    for cc in ("bbr", "cubic"):
        link = QuicLink(cc, rate=rate, rtt=rtt, queue_bdp=1.0, loss=loss, total=20_000_000, seed=5)
        link.run(6.0)
        got[cc] = link.goodput(link.now - 5.0, link.now)
    assert got["bbr"] >= 0.85 * rate
    if loss:
        assert got["bbr"] >= 2 * got["cubic"], got
    else:
        assert got["bbr"] >= 0.9 * got["cubic"], got


def test_aioquic_bbr_keeps_the_deep_queue_short() -> None:
    """In a buffer of 8 BDP, CUBIC fills the buffer; BBR keeps about its probing's worth."""
    rate, rtt = 1.25e6, 0.02
    queues = {}
    for cc in ("bbr", "cubic"):
        link = QuicLink(cc, rate=rate, rtt=rtt, queue_bdp=8.0, total=10_000_000)
        link.run(6.0)
        late = sorted(q for t, q in link.up.occupancy if t > link.now - 3.0)
        queues[cc] = late[int(0.95 * len(late))]
    assert queues["bbr"] <= rate * rtt, queues  # p95 below one BDP
    assert queues["bbr"] <= 0.25 * queues["cubic"], queues


def test_aioquic_stalled_ack_clock_recovers() -> None:
    """Every packet either way is lost for 3 s: the connection probes, and once the path is
    back the transfer resumes and finishes."""
    link = QuicLink("bbr", rate=1.25e6, rtt=0.02, total=3_000_000)
    link.run(1.0)
    got = link.server.received
    assert 0 < got < link.total
    link.up.blackout_until = link.down.blackout_until = link.now + 3.0
    link.run(3.0)
    stalled = link.server.received
    link.run(10.0)
    assert link.server.received == link.total, (got, stalled, link.server.received)


# --- the choice ----------------------------------------------------------------------------------------


def test_transport_config_validates_the_algorithm() -> None:
    assert TransportConfig().congestion == "reno"
    for name in ("reno", "cubic", "bbr"):
        assert TransportConfig(congestion=name).congestion == name
    with pytest.raises(ConfigError, match="congestion"):
        TransportConfig(congestion="vegas")


def test_backend_without_hooks_refuses_bbr() -> None:
    class FakeConfiguration:
        congestion_control_algorithm = "reno"

    fake = quic_backend.Backend(**{**quic_backend.load("aioquic").__dict__, "name": "qh3"})
    with pytest.raises(ConfigError, match="'bbr' needs a QUIC backend with Python congestion"):
        library_algorithm("bbr", fake)
    qc = FakeConfiguration()
    configure(qc, "cubic", fake)
    assert qc.congestion_control_algorithm == "cubic"
    with pytest.raises(ConfigError, match="unknown congestion control"):
        library_algorithm("vegas", quic_backend.load("aioquic"))


def test_a_bbr_connection_gets_the_hooks_and_others_do_not() -> None:
    for cc, hooked in (("bbr", True), ("cubic", False), ("reno", False)):
        ccfg, _ = _configs(cc)
        quic = QuicConnection(configuration=ccfg)
        assert (attach(quic, quic_backend.load("aioquic")) is not None) is hooked


async def _roundtrip(congestion: str) -> tuple[str, int]:
    from iac.transport.quic import dial_quic, listen_quic
    from iac.wire.frames import FrameType, encode_frame
    from iac.wire.identity import Identity

    config = TransportConfig(congestion=congestion)
    got: asyncio.Queue[int] = asyncio.Queue()

    async def on_conn(conn: Any) -> None:
        total = 0
        for _ in range(20):
            item = await conn.recv()
            total += len(item.frame.body)
        await got.put(total)

    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn, config=config)
    try:
        conn = await dial_quic(listener.addresses[0], Identity.generate(), config=config)
        try:
            algo = type(conn._quic._loss._cc).__name__
            frame = encode_frame(FrameType.MESSAGE, b"x" * 100_000)
            for _ in range(20):
                await conn.send(frame)
            total = await asyncio.wait_for(got.get(), 20)
        finally:
            await conn.close()
    finally:
        await listener.close()
    return algo, total


@pytest.mark.parametrize(
    ("congestion", "cls"), [("bbr", "BbrCongestionControl"), ("cubic", "CubicCongestionControl")]
)
def test_dial_and_listen_run_the_chosen_algorithm(congestion: str, cls: str) -> None:
    algo, total = asyncio.run(_roundtrip(congestion))
    assert algo == cls
    assert total == 20 * 100_000
