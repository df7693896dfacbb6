"""The connection core: one sans-IO state machine under every adapter's :class:`Connection`.

Both adapters (:class:`~iac.transport.stream.StreamConnection` over TLS/TCP and UNIX
sockets, :class:`~iac.transport.quic.QuicConn` over QUIC) move bytes and arm timers; what
a connection *is* at any moment, and why it closed, is decided here, without asyncio,
sockets or a clock (time comes in as ``now``, as in aioquic's ``QuicConnection``):

* :class:`State` and the one transition table :data:`TRANSITIONS` (h11's ``_state.py``
  shape): ``HANDSHAKING -> OPEN -> CLOSING -> CLOSED``. ``closed`` means one thing on
  every adapter: closing has started (CLOSING or CLOSED).
* the close error: :meth:`ConnectionCore.close` and :meth:`ConnectionCore.terminated` are
  the only places that set it; the first cause wins. Each closing event has one text
  (:func:`closed_by_this_side`, :func:`idle_error`, :func:`~iac.transport.session.peer_closed_error`,
  :func:`~iac.transport.session.local_protocol_error`).
* the backlog judge (:meth:`ConnectionCore.judge`): received frames, in order, through the
  session's rules into the receive queue while it has room; a peer's GOAWAY closes.
* the timers (:meth:`ConnectionCore.next_timer`, :meth:`ConnectionCore.handle_timer`): the
  idle deadline and, where the adapter sends its own liveness probes (QUIC), the next PING;
  :meth:`ConnectionCore.next_wake` is the instant to ask the loop's shared timer structure
  (:mod:`iac.transport.timers`) for, each deadline rounded up as far as it may be late.
* the linger decision (:meth:`ConnectionCore.flushes_on_close`, :meth:`ConnectionCore.linger_until`).

* liveness probes (:meth:`ConnectionCore.probe`, :meth:`ConnectionCore.heard`): a probe the
  peer does not answer within its bound closes the connection (:data:`TimerEvent.DEAD`).

Decisions that later belong to one connection (connection limits, path MTU) are made here
too, as inputs (``now``, events) and outputs (a state change, a :class:`TimerEvent`).
"""

from __future__ import annotations

import enum

from iac.errors import CloseCode, ConnectionClosed, IacError, LocalError
from iac.transport.queues import Inbox
from iac.transport.session import PeerGoaway, SessionLogic, peer_closed_error
from iac.transport.timers import rounded

#: How late a keep-alive or idle deadline may fire, as a share of its interval (capped at
#: :data:`MAX_SLACK`); a liveness probe's deadline, likewise capped at :data:`PROBE_SLACK`.
SLACK_SHARE = 0.1
MAX_SLACK = 1.0
PROBE_SLACK = 0.1


def keepalive_slack(keepalive: float) -> float:
    """How late a keep-alive PING may go: a tenth of its interval, at most :data:`MAX_SLACK`."""
    return min(MAX_SLACK, SLACK_SHARE * keepalive)


class State(enum.Enum):
    """Where a connection is in its life."""

    HANDSHAKING = "handshaking"  #: the HELLO exchange runs (QUIC: 0-RTT frames may flow)
    OPEN = "open"  #: both HELLOs verified: frames flow both ways
    CLOSING = "closing"  #: the close error is set; GOAWAY, flush and linger go on
    CLOSED = "closed"  #: the transport is gone; everything is released


class Event(enum.Enum):
    """What moves a connection from one state to the next."""

    VERIFIED = "verified"  #: the peer's HELLO verified
    CLOSE = "close"  #: a reason to close: this side, the peer's GOAWAY, a fault, idle
    TERMINATED = "terminated"  #: the transport under the connection ended
    PROBE = "probe"  #: a liveness probe went out; the peer answers it within a bound or the core closes


#: The one transition table. A pair that is not here is a bug of the adapter
#: (:class:`~iac.errors.LocalError`, reason ``invalid_transition``), never a state a connection gets into.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.HANDSHAKING, Event.VERIFIED): State.OPEN,
    (State.HANDSHAKING, Event.CLOSE): State.CLOSING,
    (State.HANDSHAKING, Event.TERMINATED): State.CLOSED,
    (State.OPEN, Event.CLOSE): State.CLOSING,
    (State.OPEN, Event.TERMINATED): State.CLOSED,
    (State.OPEN, Event.PROBE): State.OPEN,
    (State.CLOSING, Event.CLOSE): State.CLOSING,
    (State.CLOSING, Event.TERMINATED): State.CLOSED,
    (State.CLOSED, Event.CLOSE): State.CLOSED,
    (State.CLOSED, Event.TERMINATED): State.CLOSED,
}


class Judged(enum.Enum):
    """How a pass of :meth:`ConnectionCore.judge` ended."""

    DONE = "done"  #: nothing is left to judge
    BLOCKED = "blocked"  #: the receive queue or budget has no room: stop reading
    MORE = "more"  #: the per-turn limit was reached: go on next loop turn
    GOAWAY = "goaway"  #: the peer's GOAWAY: the core began closing (no GOAWAY of ours goes)
    CLOSED = "closed"  #: the connection was closing already


class TimerEvent(enum.Enum):
    """What :meth:`ConnectionCore.handle_timer` asks of the adapter."""

    NONE = "none"  #: nothing (re-arm at :meth:`ConnectionCore.next_timer`)
    PING = "ping"  #: send a liveness probe
    IDLE = "idle"  #: no frame moved for ``idle_timeout``: the core is CLOSING; send GOAWAY IDLE_TIMEOUT
    DEAD = "dead"  #: a probe went unanswered for its bound: the core is CLOSING (:func:`silent_error`)


def closed_by_this_side(code: int, reason: str) -> ConnectionClosed:
    """The error ``send``/``recv`` raise after this side's ``close(code, reason)``."""
    return ConnectionClosed(
        f"connection closed by this side{': ' + reason if reason else ''}", int(code), reason
    )


#: The GOAWAY reason of an idle close (with code IDLE_TIMEOUT).
IDLE_REASON = "idle"


def idle_error(idle_timeout: float) -> ConnectionClosed:
    """The error of a connection closed for ``idle_timeout`` seconds without a frame."""
    return ConnectionClosed(
        f"connection idle for {idle_timeout:g} s", int(CloseCode.IDLE_TIMEOUT), IDLE_REASON
    )


#: The GOAWAY reason of a close for a probe nobody answered (with code IDLE_TIMEOUT).
SILENT_REASON = "silent"


def silent_error(bound: float) -> ConnectionClosed:
    """The error of a connection whose peer did not answer a liveness probe within ``bound`` s."""
    return ConnectionClosed(
        f"peer silent: a liveness probe went unanswered for {bound:g} s",
        int(CloseCode.IDLE_TIMEOUT),
        SILENT_REASON,
    )


class ConnectionCore:
    """One connection's state, close error, backlog judge and timers (no I/O, no clock).

    ``idle_timeout``: seconds without a frame either way before the connection closes
    (None: never). ``keepalive``: seconds between liveness probes the adapter sends
    itself (None: the adapter has none, as TCP keep-alive runs in the kernel).
    ``linger``: how long a closing side waits for a flush or for the peer to hang up.
    """

    def __init__(
        self,
        *,
        now: float,
        idle_timeout: float | None,
        linger: float,
        keepalive: float | None = None,
        probe_interval: float = 0.5,
        probe_timeout: float = 2.5,
        keepalive_defer: float = 0.0,
    ) -> None:
        self._state = State.HANDSHAKING
        self._error: IacError | None = None
        #: Closing has started (CLOSING or CLOSED): the one meaning of ``Connection.closed``.
        #: Kept by the core (read it; a plain attribute, read on every frame).
        self.closed = False
        #: The transport is gone (CLOSED). Kept by the core.
        self.ended = False
        #: When a frame last moved either way; the adapter sets it (on every frame, so an
        #: attribute rather than a call). The idle deadline counts from it.
        self.last_activity = now
        self.idle_timeout = idle_timeout
        self.keepalive = keepalive
        self.linger = linger
        self._next_ping: float | None = None
        #: The outstanding probe: when it is due answered, and its bound (None: no probe out).
        self._probe_due: float | None = None
        self._probe_bound = 0.0
        self._probe_sent = 0.0
        #: Something on this side waits on the peer (requests, transfers, streams): set by the
        #: node. While it holds, a peer not heard from for ``probe_interval`` is probed, and
        #: closed if it does not answer within ``probe_timeout`` (adapters that probe: QUIC).
        self.waiting = False
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        #: When the peer was last heard from: a probe or keep-alive answered, or data received
        #: (the adapter sets it, on every frame received: an attribute).
        self.last_heard = now
        #: When a packet last arrived from the peer, whatever it carried (a PING, an ACK): the
        #: adapter sets it (an attribute). The keep-alive PING is due only ``keepalive`` after
        #: it: a peer heard from within the interval keeps the path open both ways already.
        self.last_packet = now
        #: How much longer than ``keepalive`` after the last packet this side waits before its
        #: PING: the accepting side waits the keep-alive's slack twice over, so that on a quiet
        #: connection the dialer's PING (whose ACK both ends hear) is the one that goes, rather
        #: than both ends' in the same instant.
        self.keepalive_defer = keepalive_defer
        #: From this instant on, a packet from the peer moves the keep-alive PING past the wake-up
        #: :meth:`next_wake` last gave, which would then find nothing due: the adapter asks for a
        #: new wake-up at such a packet instead (an attribute, compared on every packet; ``inf``:
        #: no packet moves the wake-up, as when a probe's or the idle deadline comes first).
        self.rearm_after = float("inf")
        self._linger_from: float | None = None
        self.session: SessionLogic | None = None

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def error(self) -> IacError | None:
        """Why the connection closed (None while it is not closing)."""
        return self._error

    def _move(self, event: Event) -> State:
        try:
            new = TRANSITIONS[(self._state, event)]
        except KeyError:
            raise LocalError(
                f"{event.value} in state {self._state.value}", reason="invalid_transition"
            ) from None
        self._state = new
        self.closed = new is State.CLOSING or new is State.CLOSED
        self.ended = new is State.CLOSED
        return new

    def open(self, session: SessionLogic) -> bool:
        """The peer's HELLO verified: judge frames with ``session`` from now on. False (and
        nothing changes) when the connection is already closing."""
        self.session = session
        if self.closed:
            return False
        self._move(Event.VERIFIED)
        return True

    def close(self, error: IacError) -> bool:
        """A reason to close: ``error`` becomes the close error unless one is set (the first
        cause wins). True when this call began the close (the adapter then sends GOAWAY,
        flushes, lingers); False when the connection was closing already."""
        began = not self.closed
        if self._error is None:
            self._error = error
        self._move(Event.CLOSE)
        return began

    def terminated(self, error: IacError | None = None) -> bool:
        """The transport ended (``error``: why, when nothing closed it before). True the first
        time."""
        first = self._state is not State.CLOSED
        if self._error is None:
            self._error = error if error is not None else ConnectionClosed("connection closed")
        self._move(Event.TERMINATED)
        return first

    # -- receiving ------------------------------------------------------------------------------

    def judge(self, inbox: Inbox, limit: int | None = None) -> Judged:
        """Judge the backlog of ``inbox``, in order, while it has room, at most ``limit``
        frames (None: all). A frame the session refuses raises its :class:`ProtocolError`;
        the peer's GOAWAY closes the connection (:data:`Judged.GOAWAY`)."""
        session = self.session
        if session is None or self.closed:
            return Judged.CLOSED if self.closed else Judged.DONE
        left = -1 if limit is None else limit
        while inbox.backlog:
            if left == 0:
                return Judged.MORE
            frame = inbox.next_frame()
            if frame is None:
                return Judged.BLOCKED
            left -= 1
            result = session.judge(frame)
            if isinstance(result, PeerGoaway):
                inbox.judged(frame, keep=False)
                self.close(peer_closed_error(result.code, result.reason))
                return Judged.GOAWAY
            inbox.judged(frame, keep=result is not None)  # a kept frame wakes recv()
            if self.closed:  # the inbox reported a fault
                return Judged.CLOSED
        return Judged.DONE

    # -- timers ---------------------------------------------------------------------------------

    def start_keepalive(self, now: float) -> None:
        """The transport is up: the first liveness probe is due ``keepalive`` from ``now``."""
        if self.keepalive is not None and self._next_ping is None:
            self._next_ping = now + self.keepalive

    def _ping_at(self) -> float | None:
        if self._next_ping is None or self.keepalive is None:
            return None
        return max(self._next_ping, self.last_packet + self.keepalive + self.keepalive_defer)

    def next_timer(self) -> float | None:
        """When :meth:`handle_timer` is next due (None: no timer while this holds)."""
        wake = self._deadlines()
        return None if wake is None else wake[0]

    def next_wake(self) -> float | None:
        """The instant to be woken for :meth:`handle_timer`: each deadline rounded up as far as it
        may be late (:func:`~iac.transport.timers.rounded`; keep-alive and idle by a tenth of their
        interval, at most 1 s; probes at most 0.1 s), so the deadlines of many connections fall on
        shared instants. Never before :meth:`next_timer`. None: no timer while this holds."""
        wake = self._deadlines()
        if wake is None:
            self.rearm_after = float("inf")
            return None
        _exact, late, ping_late = wake
        # The keep-alive's wake-up is moved by every packet (the PING waits ``keepalive`` after
        # the last one). On the side whose peer PINGs (the accepting side waits longer) it would
        # come once per interval and find the PING not due (:meth:`handle_timer` sends it from
        # its slack before its deadline on): a packet after ``rearm_after`` makes it do so, and
        # the adapter moves it then instead: one heap entry, and the next move is due only a
        # grid step (1 s) or so later, so under load a connection moves it every second or two.
        if late == ping_late and self.keepalive is not None:
            ka = self.keepalive
            self.rearm_after = late - ka - self.keepalive_defer + keepalive_slack(ka)
        else:
            self.rearm_after = float("inf")
        return late

    def _deadlines(self) -> tuple[float, float, float] | None:
        """(the earliest deadline, the earliest rounded deadline, the keep-alive's rounded
        deadline or inf), or None."""
        if self.closed:
            return None
        exact = late = ping_late = float("inf")
        ping_at = self._ping_at()
        if ping_at is not None and self.keepalive is not None:
            exact, late = ping_at, rounded(ping_at, keepalive_slack(self.keepalive))
            ping_late = late
        probe_at: float | None = None
        if self._probe_due is not None:
            probe_at, bound = self._probe_due, self._probe_bound
        elif self.waiting and self.can_probe and self._state is State.OPEN:
            probe_at, bound = self.last_heard + self.probe_interval, self.probe_interval
        if probe_at is not None:
            exact = min(exact, probe_at)
            late = min(late, rounded(probe_at, min(PROBE_SLACK, SLACK_SHARE * bound)))
        if self.idle_timeout is not None:
            idle_at = self.last_activity + self.idle_timeout
            exact = min(exact, idle_at)
            late = min(late, rounded(idle_at, min(MAX_SLACK, SLACK_SHARE * self.idle_timeout)))
        if exact == float("inf"):
            return None
        return exact, late, ping_late

    def handle_timer(self, now: float) -> TimerEvent:
        """The timer fired at ``now``: close an idle connection (:data:`TimerEvent.IDLE`, the
        core is CLOSING with :func:`idle_error`) or one whose probe went unanswered
        (:data:`TimerEvent.DEAD`), or ask for a PING: the keep-alive (``keepalive`` after the last
        one and after the last packet from the peer, :attr:`last_packet`), or a probe of a peer that
        something :attr:`waiting` on it has not heard from for ``probe_interval``."""
        if self.closed:
            return TimerEvent.NONE
        idle = self.idle_timeout
        if idle is not None and now - self.last_activity >= idle:
            self.close(idle_error(idle))
            return TimerEvent.IDLE
        if self._probe_due is not None and now >= self._probe_due:
            if self.last_heard < self._probe_sent:
                self.close(silent_error(self._probe_bound))
                return TimerEvent.DEAD
            self._probe_due = None  # the peer was heard from meanwhile (its data)
        quiet = now >= self.last_heard + self.probe_interval
        if self.waiting and self._probe_due is None and quiet and self.probe(now, self.probe_timeout):
            if self.keepalive is not None:
                self._next_ping = now + self.keepalive
            return TimerEvent.PING
        ping_at = self._ping_at()
        # a PING may go up to its slack late, so also that much early: a wake-up rounded for the
        # deadline as it was before the last packet moved it does not need a second one
        if (
            ping_at is not None
            and self.keepalive is not None
            and now >= ping_at - keepalive_slack(self.keepalive)
        ):
            self._next_ping = now + self.keepalive
            return TimerEvent.PING
        return TimerEvent.NONE

    # -- liveness probes ------------------------------------------------------------------------

    @property
    def can_probe(self) -> bool:
        """Whether the adapter sends its own probes (QUIC PING); on TLS/TCP and UNIX sockets
        the kernel reports a dead peer (a reset, or TCP keep-alive)."""
        return self.keepalive is not None

    @property
    def probing(self) -> bool:
        """A probe is out and not answered yet."""
        return self._probe_due is not None

    def probe(self, now: float, bound: float) -> bool:
        """Ask whether the peer is alive: True when the adapter must send a probe now (the
        peer then answers within ``bound`` seconds, or :meth:`handle_timer` closes the core with
        :func:`silent_error`). False: the connection is not open, the adapter cannot probe, or
        a probe is already out (its deadline is brought forward to ``now + bound``)."""
        if self._state is not State.OPEN or not self.can_probe:
            return False
        due = now + bound
        if self._probe_due is not None:
            if due < self._probe_due:
                self._probe_due, self._probe_bound = due, bound
            return False
        self._move(Event.PROBE)
        self._probe_due, self._probe_bound, self._probe_sent = due, bound, now
        return True

    def heard(self, now: float) -> None:
        """The peer answered a probe or a keep-alive: it is alive at ``now``."""
        self.last_heard = now
        self._probe_due = None

    # -- closing --------------------------------------------------------------------------------

    def flushes_on_close(self, verified: bool) -> bool:
        """Whether a close by this side first lets what is queued reach the peer: only on a
        connection that opened (``verified``) and that nothing else closed before."""
        return verified and self._error is None and not self.closed

    def linger_until(self, now: float) -> float:
        """The deadline of one linger wait that starts at ``now``."""
        return now + self.linger


__all__ = [
    "IDLE_REASON",
    "SILENT_REASON",
    "TRANSITIONS",
    "ConnectionCore",
    "Event",
    "Judged",
    "State",
    "TimerEvent",
    "closed_by_this_side",
    "idle_error",
    "keepalive_slack",
    "silent_error",
]
