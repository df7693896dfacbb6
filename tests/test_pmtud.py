"""Path MTU discovery (iac.transport.quic.pmtud, sans-IO) against simulated paths with a fake clock:
the search converges below the path's limit (also on a lossy path), a peer that never answers
leaves the path at 1,200 bytes, a black hole falls back within MAX_PROBES probe timeouts,
congestion loss does not, a new path starts at the base, bounds are refused."""

from __future__ import annotations

import random

import pytest

from iac.errors import ConfigError
from iac.testing import Impairment
from iac.transport.base import TransportConfig
from iac.transport.quic.pmtud import (
    BASE_PLPMTU,
    COMPLETE,
    DEFAULT_MAX_PLPMTU,
    MAX_PROBES,
    SEARCH_GRANULARITY,
    SEARCHING,
    PathMtu,
)

RTT = 0.02
TIMEOUT = 0.1


class FakePath:
    """A path that carries datagrams of at most ``limit`` bytes and loses others at ``loss``."""

    #: The local interface's size: a larger probe is refused at once (EMSGSIZE); None: none is.
    interface: int | None = None

    def __init__(self, limit: int, loss: float = 0.0, seed: int = 1, answers: bool = True) -> None:
        self.limit = limit
        self.loss = loss
        self.rng = random.Random(seed)
        self.answers = answers
        self.sent: list[int] = []

    def carries(self, size: int) -> bool:
        self.sent.append(size)
        if not self.answers or size > self.limit:
            return False
        return not (self.loss and self.rng.random() < self.loss)


def drive(pm: PathMtu, path: FakePath, now: float, until: float) -> float:
    """Run probes over ``path`` from ``now`` to ``until`` (fake time); returns the end time."""
    while now < until:
        size = pm.next_probe(now)
        if size is None:
            deadline = pm.probe_deadline
            if deadline is None:
                return now
            now = deadline
            pm.on_timer(now)
            continue
        ident = pm.probe_sent(size, now, TIMEOUT)
        if path.interface is not None and size > path.interface:
            path.sent.append(size)
            pm.probe_refused(ident, now)
        elif path.carries(size):
            now += RTT
            pm.probe_acked(ident, now)
        else:  # nobody answers: the probe timer says it is lost
            deadline = pm.probe_deadline
            assert deadline is not None
            now = deadline
            pm.on_timer(now)
    return now


@pytest.mark.parametrize("limit", [1200, 1250, 1280, 1400, 1452, 1472, 1500])
def test_search_converges_below_the_path_limit(limit: int) -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    path = FakePath(limit)
    drive(pm, path, 0.0, 60.0)
    assert pm.state == COMPLETE
    expected = min(limit, 1472)
    assert expected - SEARCH_GRANULARITY <= pm.mtu <= expected
    assert pm.stats.probes_sent <= 40  # a binary search, not a walk


def test_path_carrying_the_maximum_takes_one_probe() -> None:
    pm = PathMtu(9000)
    pm.start(0.0)
    path = FakePath(65000)
    assert drive(pm, path, 0.0, 60.0) == pytest.approx(RTT)
    assert pm.mtu == 9000
    assert path.sent == [9000]


def test_lossy_path_still_converges_and_never_exceeds_the_limit() -> None:
    for seed in range(20):
        pm = PathMtu(1472)
        pm.start(0.0)
        drive(pm, FakePath(1400, loss=0.1, seed=seed), 0.0, 120.0)
        assert pm.state == COMPLETE
        assert pm.mtu <= 1400
        assert pm.mtu >= 1400 - 2 * SEARCH_GRANULARITY  # seeded, so the same 20 paths every run


def test_peer_that_never_acknowledges_probes_stays_at_base() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    path = FakePath(65000, answers=False)
    drive(pm, path, 0.0, 600.0)
    assert pm.mtu == BASE_PLPMTU
    assert pm.state == COMPLETE
    assert pm.stats.probes_acked == 0
    assert len(path.sent) <= 6 * MAX_PROBES  # gives up: every candidate failed MAX_PROBES times
    assert all(s > BASE_PLPMTU for s in path.sent)


def test_black_hole_falls_back_within_max_probes_timeouts() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    path = FakePath(1500)
    now = drive(pm, path, 0.0, 10.0)
    assert pm.mtu == 1472
    path.limit = 1300  # the path's MTU drops: large data packets are lost
    now += 1.0
    pm.on_large_loss(now)
    assert pm.confirming
    end = drive(pm, path, now, now + 60.0)
    assert pm.mtu == BASE_PLPMTU
    assert pm.stats.fallbacks == 1
    assert pm.stats.fell_back_at is not None and pm.stats.suspected_at == now
    assert pm.stats.fell_back_at - now <= MAX_PROBES * TIMEOUT + 1e-9
    assert path.sent[-MAX_PROBES:] == [1472] * MAX_PROBES  # confirmation probes of the old size
    # it searches again only after the raise interval, and then finds the new size
    assert pm.next_probe(end + 1.0) is None
    drive(pm, path, end + pm.raise_interval, end + pm.raise_interval + 60.0)
    assert 1300 - SEARCH_GRANULARITY <= pm.mtu <= 1300


def test_congestion_loss_is_confirmed_and_keeps_the_size() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    path = FakePath(1500)
    now = drive(pm, path, 0.0, 10.0)
    for i in range(5):
        pm.on_large_loss(now + i)
        assert pm.next_probe(now + i) == 1472  # a confirmation probe
        drive(pm, path, now + i, now + i + 0.5)
        assert not pm.confirming
    assert pm.mtu == 1472
    assert pm.stats.fallbacks == 0
    assert pm.stats.suspicions == 5


def test_loss_at_base_is_no_suspicion() -> None:
    pm = PathMtu(1472, enabled=False)
    pm.start(0.0)
    pm.on_large_loss(1.0)
    assert pm.next_probe(1.0) is None
    assert pm.mtu == BASE_PLPMTU
    assert pm.stats.suspicions == 0


def test_new_path_starts_at_base_and_searches_again() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    now = drive(pm, FakePath(1472), 0.0, 10.0)
    assert pm.mtu == 1472
    pm.reset(now)
    assert pm.mtu == BASE_PLPMTU
    assert pm.state == SEARCHING
    drive(pm, FakePath(1280), now, now + 60.0)
    assert 1280 - SEARCH_GRANULARITY <= pm.mtu <= 1280
    assert pm.stats.paths == 2


def test_stale_answers_are_ignored() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    assert pm.next_probe(0.0) == 1472
    first = pm.probe_sent(1472, 0.0, TIMEOUT)
    pm.on_timer(TIMEOUT)  # expired
    second = pm.probe_sent(1472, TIMEOUT, TIMEOUT)
    pm.probe_acked(first, TIMEOUT + 0.01)  # the first one's late ACK changes nothing
    assert pm.mtu == BASE_PLPMTU
    pm.probe_acked(second, TIMEOUT + 0.02)
    assert pm.mtu == 1472


def test_refused_probe_fails_its_size_at_once() -> None:
    pm = PathMtu(9000)
    pm.start(0.0)
    ident = pm.probe_sent(pm.next_probe(0.0) or 0, 0.0, TIMEOUT)
    pm.probe_refused(ident, 0.0)  # EMSGSIZE: larger than the local interface
    nxt = pm.next_probe(0.0)
    assert nxt is not None and nxt < 9000


def test_peer_limit_caps_the_search() -> None:
    pm = PathMtu(9000)
    pm.limit(1350)
    pm.start(0.0)
    path = FakePath(65000)
    drive(pm, path, 0.0, 10.0)
    assert pm.mtu == 1350
    assert max(path.sent) == 1350


def test_raise_timer_searches_again() -> None:
    pm = PathMtu(1472, raise_interval=100.0)
    pm.start(0.0)
    path = FakePath(1300)
    now = drive(pm, path, 0.0, 50.0)
    assert pm.next_probe(now + 50.0) is None
    path.limit = 1500  # the path grew
    drive(pm, path, now + 100.0, now + 200.0)
    assert pm.mtu == 1472


def test_bounds_are_refused() -> None:
    with pytest.raises(ConfigError):
        PathMtu(1199)
    with pytest.raises(ConfigError):
        PathMtu(65528)
    with pytest.raises(ConfigError):
        TransportConfig(quic_max_datagram_size=1000)
    with pytest.raises(ConfigError):
        TransportConfig(quic_max_datagram_size=70000)
    with pytest.raises(ConfigError):
        Impairment(mtu=20)
    assert TransportConfig().quic_pmtud is True
    assert TransportConfig().quic_max_datagram_size == 16384


def test_command_line_option() -> None:
    import argparse

    from iac.cli.options import add_transport_options, transport_config

    p = argparse.ArgumentParser()
    add_transport_options(p)
    assert transport_config(p.parse_args([])).quic_max_datagram_size == 16384
    assert transport_config(p.parse_args(["--max-datagram-size", "9000"])).quic_max_datagram_size == 9000
    off = transport_config(p.parse_args(["--max-datagram-size", "0"]))
    assert off.quic_pmtud is False
    with pytest.raises(ConfigError, match="quic_max_datagram_size"):
        transport_config(p.parse_args(["--max-datagram-size", "900"]))


def test_a_large_data_packet_acknowledged_after_the_loss_ends_the_suspicion() -> None:
    pm = PathMtu(1472)
    pm.start(0.0)
    now = drive(pm, FakePath(1500), 0.0, 10.0)
    pm.on_large_loss(now)  # a full receive buffer, say
    pm.on_large_acked(1472, now - 0.01, now + 0.02)  # sent before the loss was noticed: proves nothing
    assert pm.confirming
    pm.on_large_acked(1300, now + 0.01, now + 0.03)  # smaller than the current size: proves nothing
    assert pm.confirming
    pm.on_large_acked(1472, now + 0.01, now + 0.03)
    assert not pm.confirming and pm.next_probe(now + 0.03) is None
    assert pm.mtu == 1472 and pm.stats.fallbacks == 0


class InterfacePath(FakePath):
    """A path behind a local interface of ``interface`` bytes: a larger probe is refused at once
    (EMSGSIZE), a probe up to it but above ``limit`` is lost silently further on."""

    def __init__(self, limit: int, interface: int) -> None:
        super().__init__(limit)
        self.interface = interface


@pytest.mark.parametrize(
    ("limit", "interface", "settles"),
    [
        (1472, 1472, 1472),  # a 1,500-byte Ethernet host, IPv4
        (1452, 1452, 1452),  # the same over IPv6
        (8972, 8972, 8972),  # a jumbo-frame LAN
        (1472, 8972, 1472),  # a jumbo-frame interface, a 1,500-byte hop further on
        (1472, 65507, 1472),  # loopback through a 1,500-byte emulated path
        (65507, 65507, 16384),  # loopback: the default ceiling, one probe
    ],
)
def test_default_ceiling_settles_at_common_sizes(limit: int, interface: int, settles: int) -> None:
    pm = PathMtu(DEFAULT_MAX_PLPMTU)
    pm.start(0.0)
    path = InterfacePath(limit, interface)
    end = drive(pm, path, 0.0, 60.0)
    assert pm.state == COMPLETE and pm.mtu == settles
    if interface == limit:  # every failed size refused at once: one round trip in all
        assert end == pytest.approx(RTT)
        assert path.sent.count(settles) == 1
    else:  # the sizes above are lost silently: each takes MAX_PROBES probe timeouts
        assert end <= 12 * MAX_PROBES * TIMEOUT + RTT
    assert max(s for s in path.sent if s <= limit) == settles
