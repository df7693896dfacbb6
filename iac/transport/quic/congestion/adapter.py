"""BBR inside aioquic 1.7: the congestion controller it knows as ``"bbr"``, and the hooks BBR
needs that aioquic's congestion interface does not have.

aioquic creates a connection's controller by name (``register_congestion_control``) and
tells it about each packet sent, acknowledged and lost. Three things are missing, and
:class:`BbrHooks` (attached to one connection by the asyncio protocol) adds them, reaching
into aioquic's private ``QuicPacketRecovery`` -- hence the pin on aioquic 1.7
(:data:`SUPPORTED_AIOQUIC`, checked by :func:`register`):

* *the end of an ACK*: BBR takes one rate sample per ACK, after its packets and the losses
  it revealed; the recovery's ``on_ack_received`` is wrapped to say so
  (:meth:`BbrCongestionControl.on_ack_done`);
* *the pacing rate*: aioquic paces at ``cwnd / smoothed RTT`` with a pacer of its own; the
  hooks put a :class:`AioquicPacer` in its place, which paces at BBR's rate
  (:class:`~iac.transport.quic.congestion.pacer.Pacer`);
* *app-limited*: after each flush, a connection that neither the window nor the pacer held
  back had nothing more to send (:meth:`BbrHooks.after_transmit`); the data of the next
  flush after that goes out marked app-limited too (as Linux marks a write to an empty
  send queue). So does the data of a flush that comes too late after the pacer held the
  previous one back (a busy event loop or a starved CPU fell behind the pacing rate): the
  delivery rate then measures the sender, and taking it for the path's made BBR pace ever
  slower on a loaded machine.

aioquic skips the pacer for a packet that carries an overdue ACK. So that such a packet
does not go out beyond the pacing rate, a flush while the pacer holds back moves the ACK's
deadline to the moment the pacer lets the next packet go (:meth:`BbrHooks.before_transmit`):
the ACK waits at most one packet's pacing interval.

Without the hooks (a connection made outside the QUIC adapter) the controller still works:
ACKs are taken into account when the next packet is sent, and aioquic's own pacer runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import aioquic
from aioquic.quic.congestion.base import QuicCongestionControl, register_congestion_control
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.tls import Epoch

from iac.errors import ConfigError
from iac.transport.quic.congestion.bbr import Bbr
from iac.transport.quic.congestion.pacer import Pacer
from iac.transport.quic.congestion.rate import SentSnapshot

#: The aioquic versions whose private recovery these hooks know.
SUPPORTED_AIOQUIC = "1.7."
NAME = "bbr"


class BbrCongestionControl(QuicCongestionControl):
    """aioquic's congestion-control interface in front of :class:`~.bbr.Bbr`."""

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.max_datagram_size = max_datagram_size
        self.bbr = Bbr(max_datagram_size=max_datagram_size, initial_cwnd=self.congestion_window)
        self._sent: dict[int, SentSnapshot] = {}
        self._now = 0.0
        #: Bytes of the packets counted in flight since the pacer last settled its account.
        self.sent_in_flight = 0

    def on_packet_sent(self, *, packet: QuicSentPacket) -> None:
        if self.bbr.pending:  # no hooks: the previous ACK is taken into account now
            self.on_ack_done(self._now)
        now = packet.sent_time if packet.sent_time is not None else self._now
        self._sent[id(packet)] = self.bbr.on_sent(now, packet.sent_bytes, self.bytes_in_flight)
        self.bytes_in_flight += packet.sent_bytes
        self.sent_in_flight += packet.sent_bytes

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        snapshot = self._sent.pop(id(packet), None)
        if snapshot is not None:
            self.bbr.on_acked(now, snapshot, self.bytes_in_flight)
        self.bytes_in_flight -= packet.sent_bytes
        self._now = now

    def on_packets_expired(self, *, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            self._sent.pop(id(packet), None)
            self.bytes_in_flight -= packet.sent_bytes

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            snapshot = self._sent.pop(id(packet), None)
            if snapshot is not None:
                self.bbr.on_lost(now, snapshot, self.bytes_in_flight)
            self.bytes_in_flight -= packet.sent_bytes
        self._now = now

    def on_persistent_congestion(self) -> None:
        self.bbr.on_persistent_congestion(self._now)
        self.congestion_window = self.bbr.cwnd

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self.bbr.on_rtt(now, rtt)

    def on_ack_done(self, now: float) -> None:
        """The ACK (or loss detection) that called the methods above is complete."""
        self.bbr.on_ack_done(now, self.bytes_in_flight)
        self.congestion_window = self.bbr.cwnd

    def get_log_data(self) -> dict[str, Any]:
        data = super().get_log_data()
        data["pacing_rate"] = int(self.bbr.pacing_rate)
        data["bbr_state"] = self.bbr.mode.value
        return data


class AioquicPacer:
    """Takes the place of aioquic's ``QuicPacketPacer`` (same three methods) and paces at
    BBR's rate."""

    def __init__(self, cc: BbrCongestionControl) -> None:
        self.cc = cc
        self.core = Pacer(cc.max_datagram_size)
        #: Bytes taken for the packets built since the account was last settled.
        self.charged = 0

    def next_send_time(self, now: float) -> float | None:
        self.core.set_rate(now, self.cc.bbr.pacing_rate)
        return self.core.next_send_time(now)

    def update_after_send(self, now: float) -> None:
        # The packet's size is not known yet: take a whole datagram, settle after the flush.
        self.core.on_sent(now, self.cc.max_datagram_size)
        self.charged += self.cc.max_datagram_size

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        """aioquic's recovery sets its pacer's rate from the window; BBR sets this one."""

    def settle(self) -> None:
        """After a flush: give back what the built packets did not use (all of it for
        packets that do not count in flight, such as ACK-only ones)."""
        self.core.refund(self.charged - self.cc.sent_in_flight)
        self.charged = 0
        self.cc.sent_in_flight = 0


class BbrHooks:
    """The hooks of one aioquic connection whose controller is BBR (see the module doc)."""

    def __init__(self, quic: Any, cc: BbrCongestionControl) -> None:
        self.quic = quic
        self.cc = cc
        recovery = quic._loss
        self.pacer = AioquicPacer(cc)
        recovery._pacer = self.pacer
        self._space: QuicPacketSpace | None = None
        self._ran_out = False
        self._paced_until: float | None = None  # when the pacer let the held-back flush go
        original = recovery.on_ack_received

        def on_ack_received(
            *, ack_rangeset: RangeSet, ack_delay: float, now: float, space: QuicPacketSpace
        ) -> None:
            original(ack_rangeset=ack_rangeset, ack_delay=ack_delay, now=now, space=space)
            if cc.bbr.pending:
                cc.on_ack_done(now)

        recovery.on_ack_received = on_ack_received

    def before_transmit(self, now: float) -> None:
        """Right before ``datagrams_to_send``: data that arrives after the sender ran out, or
        after the sender fell behind its own pacing, goes out app-limited; an overdue ACK waits
        for the pacer."""
        cc = self.cc
        if self._ran_out or self._fell_behind(now):
            cc.bbr.on_app_limited(cc.bytes_in_flight)
            self._ran_out = False
        self._paced_until = None
        space = self._space
        if space is None:
            space = self._space = self.quic._spaces.get(Epoch.ONE_RTT)
            if space is None:
                return
        if space.ack_at is not None and space.ack_at <= now:
            release = self.pacer.next_send_time(now)
            if release is not None:
                space.ack_at = release

    def after_transmit(self, now: float) -> None:
        """Right after ``datagrams_to_send``: settle the pacer's account; a flush that neither
        the window nor the pacer cut short means the sender ran out of data."""
        self.pacer.settle()
        cc = self.cc
        self._paced_until = self.quic._pacing_at
        if self._paced_until is None and cc.bytes_in_flight + cc.max_datagram_size <= cc.congestion_window:
            cc.bbr.on_app_limited(cc.bytes_in_flight)
            self._ran_out = True

    def _fell_behind(self, now: float) -> bool:
        """The last flush stopped for the pacer, and this one comes so late that the pacer's
        bucket overflowed by a datagram or more: the sender (its event loop, its CPU) did not
        keep up with its own pacing rate. What is delivered meanwhile measures the sender, not
        the path, so it must not lower the bandwidth estimate (it would pace slower, fall
        behind less, measure less again: a spiral down to whatever the loop can do)."""
        paced_until, core = self._paced_until, self.pacer.core
        if paced_until is None or not core.rate:
            return False
        return now - paced_until > core.capacity / core.rate


def attach(quic: Any) -> BbrHooks | None:
    """Hook BBR into ``quic`` (an aioquic ``QuicConnection``); None when its controller is
    not BBR."""
    cc = getattr(getattr(quic, "_loss", None), "_cc", None)
    if not isinstance(cc, BbrCongestionControl):
        return None
    return BbrHooks(quic, cc)


_registered = False


def register() -> None:
    """Register :class:`BbrCongestionControl` with aioquic as ``"bbr"`` (once)."""
    global _registered
    if _registered:
        return
    version = str(aioquic.__version__)
    if not version.startswith(SUPPORTED_AIOQUIC):
        raise ConfigError(
            f"congestion control 'bbr' needs aioquic {SUPPORTED_AIOQUIC}x (it hooks into the "
            f"library's packet recovery); aioquic {version} is installed"
        )
    register_congestion_control(NAME, BbrCongestionControl)
    _registered = True


__all__ = ["SUPPORTED_AIOQUIC", "AioquicPacer", "BbrCongestionControl", "BbrHooks", "attach", "register"]
