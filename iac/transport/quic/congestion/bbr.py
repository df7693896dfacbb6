"""BBR congestion control (version 1, as Linux ``tcp_bbr.c`` and the IETF draft describe it),
sans-IO: no clock, no socket, no QUIC library; time is an argument of every input.

BBR models the path by two numbers and paces to them instead of reacting to loss:

* the bottleneck bandwidth ``bw``: the largest delivery rate measured over the last
  :data:`BW_WINDOW_ROUNDS` round trips (app-limited samples count only when they raise it);
* the round-trip propagation time ``min_rtt``: the smallest RTT seen over the last
  :data:`MIN_RTT_WINDOW` seconds.

Their product is the bandwidth-delay product (BDP). The sender paces at ``pacing_gain x bw``
and keeps at most ``cwnd_gain x BDP`` (plus a few packets of allowance) in flight.

States:

* STARTUP: gains 2/ln 2 (doubling the delivery rate each round) until three rounds in a row
  raised ``bw`` by less than 25 % (the pipe is full);
* DRAIN: pacing gain ln 2 / 2 until the queue STARTUP built is gone (in flight <= BDP);
* PROBE_BW: the pacing gain cycles through :data:`PACING_GAIN_CYCLE` (1.25 to probe for more
  bandwidth, 0.75 to drain what the probe queued, then six phases at 1), one phase per
  ``min_rtt``; cwnd gain 2;
* PROBE_RTT: when ``min_rtt`` was not refreshed for :data:`MIN_RTT_WINDOW` seconds, at most
  :data:`MIN_CWND_PACKETS` packets in flight for :data:`PROBE_RTT_DURATION` and one round
  trip, so that the queue empties and the path's own RTT shows again.

Loss: BBR does not slow down on loss. When a loss starts a recovery episode it keeps the
window at what is in flight plus what was just acknowledged (packet conservation) for one
round trip, takes the lost bytes off the window, and restores the window it had when the
episode ends. Persistent congestion (QUIC's retransmission timeout) drops the window to
the minimum until the next acknowledgement after it.

ACK aggregation (from Linux BBR): the window also covers the most data that arrived in one
burst of ACKs beyond what ``bw`` predicts (over the last 5-10 round trips, at most 100 ms
of ``bw``), so that a receiver or a network that batches ACKs does not starve the sender.

Inputs: :meth:`Bbr.on_sent`, :meth:`Bbr.on_acked` / :meth:`Bbr.on_lost` for each packet an
ACK (or the loss timer) settles, then :meth:`Bbr.on_ack_done` once per ACK;
:meth:`Bbr.on_rtt`, :meth:`Bbr.on_app_limited`, :meth:`Bbr.on_persistent_congestion`.
Outputs: :attr:`Bbr.cwnd` (bytes) and :attr:`Bbr.pacing_rate` (bytes per second).
"""

from __future__ import annotations

import enum
import math
import random

from iac.transport.quic.congestion.rate import DeliveryRateSampler, RateSample, SentSnapshot, WindowedMax

#: 2/ln 2: the smallest gain that doubles the delivery rate every round trip.
HIGH_GAIN = 2.885
DRAIN_GAIN = 1.0 / HIGH_GAIN
CWND_GAIN = 2.0
PACING_GAIN_CYCLE = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
#: The bandwidth filter's window, in round trips (the gain cycle plus two).
BW_WINDOW_ROUNDS = len(PACING_GAIN_CYCLE) + 2
#: The min-RTT filter's window, seconds.
MIN_RTT_WINDOW = 10.0
PROBE_RTT_DURATION = 0.2
MIN_CWND_PACKETS = 4
INITIAL_CWND_PACKETS = 10
#: STARTUP ends after FULL_BW_ROUNDS rounds in which bw grew by less than FULL_BW_GROWTH.
FULL_BW_GROWTH = 1.25
FULL_BW_ROUNDS = 3
#: Pace 1 % below the estimate, so that a queue does not build at exactly the bottleneck rate.
PACING_MARGIN = 0.01
#: ACK aggregation: window in round trips (two halves) and the cap in seconds of bw.
EXTRA_ACKED_WINDOW_ROUNDS = 5
EXTRA_ACKED_MAX_TIME = 0.1
#: An aggregation epoch this many packets long is stale: start a new one.
ACK_EPOCH_RESET_PACKETS = 1 << 20
#: The RTT used for the initial pacing rate before any RTT sample.
DEFAULT_INITIAL_RTT = 0.1
#: The pacer's burst: this long at the pacing rate, at least two datagrams (see the pacer).
SEND_QUANTUM_TIME = 0.001


class Mode(enum.Enum):
    STARTUP = "startup"
    DRAIN = "drain"
    PROBE_BW = "probe_bw"
    PROBE_RTT = "probe_rtt"


class Bbr:
    """One connection's BBR state. Bytes and seconds throughout."""

    def __init__(
        self,
        *,
        max_datagram_size: int,
        initial_cwnd: int | None = None,
        initial_rtt: float = DEFAULT_INITIAL_RTT,
        rng: random.Random | None = None,
    ) -> None:
        self.mds = max_datagram_size
        self.initial_cwnd = initial_cwnd or INITIAL_CWND_PACKETS * max_datagram_size
        self.min_cwnd = MIN_CWND_PACKETS * max_datagram_size
        self.rng = rng or random.Random()
        self.sampler = DeliveryRateSampler()
        self.mode = Mode.STARTUP
        self.cwnd = self.initial_cwnd
        self.prior_cwnd = 0
        self.pacing_gain = HIGH_GAIN
        self.cwnd_gain = HIGH_GAIN
        self.pacing_rate = HIGH_GAIN * self.initial_cwnd / initial_rtt
        self._has_seen_rtt = False
        # the model
        self._bw = WindowedMax(BW_WINDOW_ROUNDS)
        self.min_rtt = math.inf
        self._min_rtt_stamp = 0.0
        self._rtt_sample: float | None = None
        # round trips
        self.round_count = 0
        self.round_start = False
        self._next_round_delivered = 0
        # STARTUP's exit
        self.full_bw_reached = False
        self._full_bw = 0.0
        self._full_bw_count = 0
        # PROBE_BW
        self.cycle_index = 0
        self._cycle_stamp = 0.0
        # PROBE_RTT
        self._probe_rtt_done_stamp: float | None = None
        self._probe_rtt_round_done = False
        self.idle_restart = False
        # loss recovery
        self.in_recovery = False
        self._recovery_start = -math.inf
        self._entered_recovery = False
        self._exited_recovery = False
        self._packet_conservation = False
        # ACK aggregation
        self._extra_acked = [0, 0]
        self._extra_acked_index = 0
        self._extra_acked_rounds = 0
        self._ack_epoch_time = 0.0
        self._ack_epoch_acked = 0

    # --- the model, read-only ------------------------------------------------------------------

    @property
    def bw(self) -> float:
        """The bottleneck bandwidth estimate, bytes per second (0 before the first sample)."""
        return self._bw.best

    def bdp(self, gain: float = 1.0) -> int:
        """``gain`` x bw x min_rtt, bytes (the initial window before there is a model)."""
        if math.isinf(self.min_rtt) or self.bw == 0:
            return self.initial_cwnd
        return int(gain * self.bw * self.min_rtt)

    @property
    def send_quantum(self) -> int:
        """The pacer's burst: max(2 datagrams, 1 ms at the pacing rate)."""
        return max(2 * self.mds, int(self.pacing_rate * SEND_QUANTUM_TIME))

    def inflight_target(self, gain: float) -> int:
        """The data in flight BBR aims for at ``gain``: the BDP, plus room for the pacer's
        bursts, plus two packets while probing for bandwidth."""
        target = self.bdp(gain) + 3 * self.send_quantum
        if self.mode is Mode.PROBE_BW and self.cycle_index == 0:
            target += 2 * self.mds
        return target

    # --- inputs --------------------------------------------------------------------------------

    def on_sent(self, now: float, size: int, bytes_in_flight: int) -> SentSnapshot:
        """A packet of ``size`` bytes is sent (``bytes_in_flight``: before it)."""
        if bytes_in_flight == 0 and self.sampler.app_limited_until:
            # Restarting after idle: no queue can have built up, so do not probe or drain.
            self.idle_restart = True
            self._ack_epoch_time, self._ack_epoch_acked = now, 0
            if self.mode is Mode.PROBE_BW:
                self._set_pacing_rate(1.0)
            elif self.mode is Mode.PROBE_RTT:
                self._check_probe_rtt_done(now)
        return self.sampler.on_sent(now, size, bytes_in_flight)

    def on_acked(self, now: float, packet: SentSnapshot, bytes_in_flight: int) -> None:
        """One packet acknowledged by the ACK being processed (``bytes_in_flight``: before)."""
        self.sampler.on_acked(now, packet, bytes_in_flight)
        if self.in_recovery and packet.sent_time > self._recovery_start:
            self.in_recovery = False
            self._exited_recovery = True

    def on_lost(self, now: float, packet: SentSnapshot, bytes_in_flight: int) -> None:
        """One packet declared lost (``bytes_in_flight``: before it left the count)."""
        self.sampler.on_lost(packet.size, bytes_in_flight)
        if not self.in_recovery and packet.sent_time > self._recovery_start:  # a new loss event
            self._save_cwnd()
            self.in_recovery = True
            self._recovery_start = now
            self._entered_recovery = True

    def on_rtt(self, now: float, rtt: float) -> None:
        """An RTT sample (from the largest newly acknowledged packet)."""
        self._rtt_sample = rtt if self._rtt_sample is None else min(self._rtt_sample, rtt)
        if not self._has_seen_rtt:
            self._has_seen_rtt = True
            if self.bw == 0:
                self.pacing_rate = HIGH_GAIN * self.initial_cwnd / max(rtt, 1e-6)

    def on_app_limited(self, bytes_in_flight: int) -> None:
        """The sender ran out of data with room left in its window."""
        self.sampler.mark_app_limited(bytes_in_flight)

    def on_persistent_congestion(self, now: float) -> None:
        """Every packet over a long period was lost (QUIC's retransmission timeout)."""
        self._save_cwnd()
        self.cwnd = self.min_cwnd
        self.in_recovery = True
        self._recovery_start = now
        self._entered_recovery = False
        self._packet_conservation = False
        self._full_bw = 0.0
        self.round_start = True

    @property
    def pending(self) -> bool:
        """Acknowledgements or losses wait for :meth:`on_ack_done`."""
        return self.sampler.pending

    def on_ack_done(self, now: float, bytes_in_flight: int) -> None:
        """Update the model and the controls once the ACK's packets (and the losses it
        revealed) went through :meth:`on_acked` / :meth:`on_lost`."""
        rs = self.sampler.sample(self.min_rtt, bytes_in_flight)
        self._update_round(rs)
        self._update_bw(rs)
        self._update_ack_aggregation(now, rs)
        self._update_cycle_phase(now, rs)
        self._check_full_bw_reached(rs)
        self._check_drain(now, bytes_in_flight)
        self._update_min_rtt(now, rs, bytes_in_flight)
        self._set_pacing_rate(self.pacing_gain)
        self._set_cwnd(rs, bytes_in_flight)
        self._rtt_sample = None

    # --- the model -----------------------------------------------------------------------------

    def _update_round(self, rs: RateSample) -> None:
        self.round_start = False
        if rs.acked and rs.prior_delivered >= self._next_round_delivered:
            self._next_round_delivered = self.sampler.delivered
            self.round_count += 1
            self.round_start = True
            self._packet_conservation = False

    def _update_bw(self, rs: RateSample) -> None:
        if rs.rate is None:
            return
        # An app-limited sample counts only when it raises the estimate: the estimate does not
        # age while the application keeps the connection below it.
        if not rs.app_limited or rs.rate >= self.bw:
            self._bw.update(self.round_count, rs.rate)

    def _update_ack_aggregation(self, now: float, rs: RateSample) -> None:
        if not rs.acked or rs.rate is None:
            return
        if self.round_start:
            self._extra_acked_rounds += 1
            if self._extra_acked_rounds >= EXTRA_ACKED_WINDOW_ROUNDS:
                self._extra_acked_rounds = 0
                self._extra_acked_index ^= 1
                self._extra_acked[self._extra_acked_index] = 0
        expected = self.bw * (now - self._ack_epoch_time)
        if self._ack_epoch_acked <= expected or self._ack_epoch_acked >= ACK_EPOCH_RESET_PACKETS * self.mds:
            self._ack_epoch_acked = 0
            self._ack_epoch_time = now
            expected = 0.0
        self._ack_epoch_acked += rs.acked
        extra = min(int(self._ack_epoch_acked - expected), self.cwnd)
        if extra > self._extra_acked[self._extra_acked_index]:
            self._extra_acked[self._extra_acked_index] = extra

    def _aggregation_cwnd(self) -> int:
        if not self.full_bw_reached:
            return 0
        return min(max(self._extra_acked), int(self.bw * EXTRA_ACKED_MAX_TIME))

    def _update_cycle_phase(self, now: float, rs: RateSample) -> None:
        if self.mode is Mode.PROBE_BW and self._is_next_cycle_phase(now, rs):
            self._advance_cycle_phase(now)

    def _is_next_cycle_phase(self, now: float, rs: RateSample) -> bool:
        full_length = now - self._cycle_stamp > self.min_rtt
        gain = self.pacing_gain
        if gain == 1.0:
            return full_length
        if gain > 1.0:  # probe until the queue holds what the higher gain put there, or loss
            return full_length and (rs.lost > 0 or rs.prior_in_flight >= self.inflight_target(gain))
        # drain: until in flight is down to the BDP, or for one min_rtt at most
        return full_length or rs.prior_in_flight <= self.inflight_target(1.0)

    def _advance_cycle_phase(self, now: float) -> None:
        self.cycle_index = (self.cycle_index + 1) % len(PACING_GAIN_CYCLE)
        self._cycle_stamp = now
        self.pacing_gain = PACING_GAIN_CYCLE[self.cycle_index]

    def _enter_probe_bw(self, now: float) -> None:
        self.mode = Mode.PROBE_BW
        self.cwnd_gain = CWND_GAIN
        # Start at a random phase, but not the draining one (0.75) right after DRAIN.
        self.cycle_index = len(PACING_GAIN_CYCLE) - 1 - self.rng.randrange(len(PACING_GAIN_CYCLE) - 1)
        self._advance_cycle_phase(now)

    def _enter_startup(self) -> None:
        self.mode = Mode.STARTUP
        self.pacing_gain = self.cwnd_gain = HIGH_GAIN

    def _check_full_bw_reached(self, rs: RateSample) -> None:
        if self.full_bw_reached or not self.round_start or rs.app_limited:
            return
        if self.bw >= self._full_bw * FULL_BW_GROWTH:
            self._full_bw = self.bw
            self._full_bw_count = 0
            return
        self._full_bw_count += 1
        self.full_bw_reached = self._full_bw_count >= FULL_BW_ROUNDS

    def _check_drain(self, now: float, bytes_in_flight: int) -> None:
        if self.mode is Mode.STARTUP and self.full_bw_reached:
            self.mode = Mode.DRAIN
            self.pacing_gain, self.cwnd_gain = DRAIN_GAIN, HIGH_GAIN
        if self.mode is Mode.DRAIN and bytes_in_flight <= self.inflight_target(1.0):
            self._enter_probe_bw(now)

    def _update_min_rtt(self, now: float, rs: RateSample, bytes_in_flight: int) -> None:
        expired = not math.isinf(self.min_rtt) and now > self._min_rtt_stamp + MIN_RTT_WINDOW
        sample = self._rtt_sample
        if sample is not None and (sample <= self.min_rtt or expired):
            self.min_rtt = sample
            self._min_rtt_stamp = now
        if expired and not self.idle_restart and self.mode is not Mode.PROBE_RTT:
            self.mode = Mode.PROBE_RTT
            self.pacing_gain = self.cwnd_gain = 1.0
            self._save_cwnd()
            self._probe_rtt_done_stamp = None
        if self.mode is Mode.PROBE_RTT:
            # Samples taken with the window held down say nothing about the bandwidth.
            self.sampler.mark_app_limited(bytes_in_flight)
            if self._probe_rtt_done_stamp is None and bytes_in_flight <= self.min_cwnd:
                self._probe_rtt_done_stamp = now + PROBE_RTT_DURATION
                self._probe_rtt_round_done = False
                self._next_round_delivered = self.sampler.delivered
            elif self._probe_rtt_done_stamp is not None:
                if self.round_start:
                    self._probe_rtt_round_done = True
                if self._probe_rtt_round_done:
                    self._check_probe_rtt_done(now)
        if rs.delivered > 0:
            self.idle_restart = False

    def _check_probe_rtt_done(self, now: float) -> None:
        if self._probe_rtt_done_stamp is None or now <= self._probe_rtt_done_stamp:
            return
        self._min_rtt_stamp = now  # the next PROBE_RTT is a whole window away
        self.cwnd = max(self.cwnd, self.prior_cwnd)
        self._probe_rtt_done_stamp = None
        if self.full_bw_reached:
            self._enter_probe_bw(now)
        else:
            self._enter_startup()

    # --- the controls --------------------------------------------------------------------------

    def _set_pacing_rate(self, gain: float) -> None:
        bw = self.bw
        if bw == 0:
            return
        rate = gain * bw * (1.0 - PACING_MARGIN)
        if self.full_bw_reached or rate > self.pacing_rate:  # STARTUP never slows down
            self.pacing_rate = rate

    def _save_cwnd(self) -> None:
        # (an ACK may end one recovery episode and reveal the loss that starts the next)
        if not (self.in_recovery or self._exited_recovery) and self.mode is not Mode.PROBE_RTT:
            self.prior_cwnd = self.cwnd
        else:
            self.prior_cwnd = max(self.prior_cwnd, self.cwnd)

    def _recover_or_restore(self, rs: RateSample, bytes_in_flight: int) -> tuple[int, bool]:
        """Linux BBR's loss response: (window, whether packet conservation holds it)."""
        cwnd = self.cwnd
        if rs.lost:
            cwnd = max(cwnd - rs.lost, self.mds)
        if self._entered_recovery:
            self._packet_conservation = True
            self._next_round_delivered = self.sampler.delivered  # a round starts now
            cwnd = bytes_in_flight + rs.acked
        elif self._exited_recovery:
            cwnd = max(cwnd, self.prior_cwnd)
            self._packet_conservation = False
        self._entered_recovery = self._exited_recovery = False
        if self._packet_conservation:
            return max(cwnd, bytes_in_flight + rs.acked), True
        return cwnd, False

    def _set_cwnd(self, rs: RateSample, bytes_in_flight: int) -> None:
        if rs.acked:
            cwnd, conserving = self._recover_or_restore(rs, bytes_in_flight)
            if not conserving:
                target = self.inflight_target(self.cwnd_gain) + self._aggregation_cwnd()
                if self.full_bw_reached:
                    cwnd = min(cwnd + rs.acked, target)
                elif cwnd < target or self.sampler.delivered < self.initial_cwnd:
                    cwnd += rs.acked
                cwnd = max(cwnd, self.min_cwnd)
            self.cwnd = cwnd
        if self.mode is Mode.PROBE_RTT:
            self.cwnd = min(self.cwnd, self.min_cwnd)


__all__ = [
    "BW_WINDOW_ROUNDS",
    "CWND_GAIN",
    "DRAIN_GAIN",
    "HIGH_GAIN",
    "MIN_CWND_PACKETS",
    "MIN_RTT_WINDOW",
    "PACING_GAIN_CYCLE",
    "PROBE_RTT_DURATION",
    "Bbr",
    "Mode",
]
