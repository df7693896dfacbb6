"""What keep-alives cost a connection in wake-ups (docs/IMPLEMENTATION.md, "Timers at scale"),
counted over virtual time: two :class:`~iac.transport.core.ConnectionCore` (the dialer's and the
accepting side's) driven as the QUIC adapter drives them (a wake-up at ``next_wake()``, moved at a
packet from the peer once ``now >= rearm_after``), with packets between them taking ``RTT``."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import pytest

from iac.transport.core import ConnectionCore, TimerEvent, keepalive_slack

KEEPALIVE = 10.0
RTT = 0.002


@dataclass
class Side:
    """One end, as the QUIC adapter (``QuicConn``) drives its core."""

    name: str
    core: ConnectionCore
    wake: float | None = None
    wakes: int = 0  #: times the wake-up came
    idle_wakes: int = 0  #: ... and found nothing due
    pings: list[float] = field(default_factory=list)
    moves: int = 0  #: times a packet moved the wake-up

    def arm(self) -> None:
        self.wake = self.core.next_wake()

    def packet(self, now: float) -> None:
        """A packet from the peer (``on_datagram``)."""
        self.core.last_packet = now
        if now >= self.core.rearm_after:
            before = self.wake
            self.arm()
            self.moves += self.wake != before


class Link:
    """Both ends and the packets in flight between them, in virtual time."""

    def __init__(self, keepalive: float = KEEPALIVE) -> None:
        defer = 2 * keepalive_slack(keepalive)  # the accepting side's, as QuicConn gives it

        def core(defer: float) -> ConnectionCore:
            return ConnectionCore(
                now=0.0, idle_timeout=None, linger=1.0, keepalive=keepalive, keepalive_defer=defer
            )

        self.dialer = Side("dialer", core(0.0))
        self.accepter = Side("accepter", core(defer))
        self.now = 0.0
        self._arrivals: list[tuple[float, int, Side, bool]] = []  # (time, seq, to, asks for an ACK)
        self._seq = itertools.count()
        self.silent: set[str] = set()  # sides whose PINGs are not sent (a peer that stopped)
        for side in (self.dialer, self.accepter):
            side.core.start_keepalive(0.0)
            side.arm()

    def other(self, side: Side) -> Side:
        return self.accepter if side is self.dialer else self.dialer

    def send(self, frm: Side, ack_eliciting: bool) -> None:
        heapq.heappush(self._arrivals, (self.now + RTT / 2, next(self._seq), self.other(frm), ack_eliciting))

    def run_until(self, end: float, traffic_every: float | None = None) -> None:
        """Advance to ``end``; ``traffic_every``: both sides exchange a request and its reply
        this often (a load step)."""
        next_traffic = self.now if traffic_every else None
        while True:
            wakes = [(s.wake, s.name) for s in (self.dialer, self.accepter) if s.wake is not None]
            candidates = [w for w, _ in wakes]
            if self._arrivals:
                candidates.append(self._arrivals[0][0])
            if next_traffic is not None:
                candidates.append(next_traffic)
            t = min(candidates, default=end)
            if t > end:
                self.now = end
                return
            self.now = t
            if self._arrivals and self._arrivals[0][0] == t:
                _, _, to, eliciting = heapq.heappop(self._arrivals)
                to.packet(t)
                if eliciting:
                    self.send(to, ack_eliciting=False)  # its ACK
                continue
            if next_traffic is not None and next_traffic == t:
                self.send(self.dialer, ack_eliciting=True)  # a request (the reply is its ACK's packet)
                next_traffic = t + (traffic_every or 0.0)
                if next_traffic > end:
                    next_traffic = None
                continue
            side = next(s for s in (self.dialer, self.accepter) if s.wake == t)
            side.wakes += 1
            event = side.core.handle_timer(t)
            if event is TimerEvent.PING:
                side.pings.append(t)
                if side.name not in self.silent:
                    self.send(side, ack_eliciting=True)
            else:
                side.idle_wakes += 1
            side.arm()


def test_a_held_connection_wakes_only_the_side_that_pings() -> None:
    link = Link()
    intervals = 50
    link.run_until(intervals * KEEPALIVE)
    dialer, accepter = link.dialer, link.accepter
    # the dialer PINGs once per interval; the accepting side, which hears that PING, is never
    # woken for a PING it then does not send (it was woken once per interval for nothing)
    assert intervals - 2 <= len(dialer.pings) <= intervals
    assert dialer.idle_wakes == 0
    assert accepter.wakes == 0
    # what it costs instead: one move of its wake-up per PING heard
    assert accepter.moves <= len(dialer.pings)


def test_a_load_step_then_quiet_wakes_nobody_for_nothing() -> None:
    """Packets every 10 ms for 30 s (a load step), then quiet: the accepting side's wake-up moves
    about once a second while packets come, and never comes to find nothing due."""
    link = Link()
    link.run_until(30.0, traffic_every=0.01)
    accepter = link.accepter
    assert accepter.wakes == 0
    assert accepter.moves <= 30 + 2
    link.run_until(30.0 + 20 * KEEPALIVE)
    assert accepter.wakes == 0
    assert link.dialer.idle_wakes == 0
    assert len(link.dialer.pings) >= 19


@pytest.mark.parametrize("keepalive", [10.0, 0.1])
def test_the_accepting_side_still_pings_once_the_dialer_stops(keepalive: float) -> None:
    """A NATed accepting side stays reachable: when the dialer's PINGs stop, its own PING goes
    ``keepalive`` plus its defer (twice the slack) after the last packet heard, up to one slack
    step later (rounding), as before wake-ups moved with packets."""
    link = Link(keepalive)
    link.run_until(5.5 * keepalive)  # between two of the dialer's PINGs
    link.silent.add("dialer")  # its PINGs go nowhere from now on
    quiet_from = link.accepter.core.last_packet
    link.run_until(8 * keepalive)
    slack = keepalive_slack(keepalive)
    first = link.accepter.pings[0]
    assert quiet_from + keepalive + slack <= first <= quiet_from + keepalive + 3 * slack + 1e-9
