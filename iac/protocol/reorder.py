"""Ordered delivery for one session: a reorder buffer keyed by msg_id. Sans-IO.

:class:`ReorderBuffer` takes messages (or refusals, :meth:`~ReorderBuffer.skip`) in
any order and returns events in msg_id order (RFC 1982 serial arithmetic, so
ids may wrap at ``2**64``):

* :class:`Delivered` — hand this item to the handler, in order.
* :class:`GapSkipped` — ids ``first_missing..last_missing`` never came in time;
  the items after them were released anyway.
* :class:`Late` — the id is behind the delivery point (already delivered,
  skipped, or inside a gap that was reported). Not delivered.
* :class:`Duplicate` — the id is already held in the buffer. Not delivered.

A message that arrives out of order is held until the gap before it fills or
its own hold time passes (``arrival + hold``). The hold is adaptive: a smoothed
jitter ``J`` of the sender-to-receiver transit time (RFC 3550: ``D`` is the
change in transit between consecutive arrivals, ``J += (|D| - J) / 16``), times
``jitter_multiplier``, clamped to ``[min_hold_us, max_hold_us]``. In *reliable*
mode (the session's ORDERED messages are also ACK_REQUESTED, so the sender will
retransmit) the hold is the sender's retransmission deadline instead. When
more than ``max_buffered`` entries are held, the oldest are released in order,
skipping (and reporting) the gaps before them: nothing is ever dropped.

Nothing here reads a clock. Call :meth:`~ReorderBuffer.poll` at
:meth:`~ReorderBuffer.next_deadline`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeAlias, TypeVar, cast

from iac.errors import ConfigError
from iac.protocol.replay import _MASK64, serial_diff

T = TypeVar("T")

DEFAULT_MAX_BUFFERED = 1024
DEFAULT_JITTER_MULTIPLIER = 4.0
DEFAULT_MIN_HOLD_US = 20_000
DEFAULT_MAX_HOLD_US = 2_000_000
DEFAULT_RETRANSMIT_DEADLINE_US = 60_000_000


@dataclass(frozen=True, slots=True)
class ReorderConfig:
    """Limits and timing of a :class:`ReorderBuffer`.

    Attributes:
        max_buffered: most entries (held messages and skipped ids) held at once
            (default 1024); beyond it the oldest are released in order.
        jitter_multiplier: ``k`` in ``hold = k * J`` (default 4).
        min_hold_us: lower clamp of the adaptive hold (default 20 ms).
        max_hold_us: upper clamp of the adaptive hold (default 2 s).
        reliable: the session's ORDERED messages are also ACK_REQUESTED: hold a
            gap for ``retransmit_deadline_us`` instead of the adaptive hold
            (default False).
        retransmit_deadline_us: the sender's retransmission deadline, used in
            reliable mode (default 60 s, which is ``max_skew``: a sender gives
            up retransmitting by then).
    """

    max_buffered: int = DEFAULT_MAX_BUFFERED
    jitter_multiplier: float = DEFAULT_JITTER_MULTIPLIER
    min_hold_us: int = DEFAULT_MIN_HOLD_US
    max_hold_us: int = DEFAULT_MAX_HOLD_US
    reliable: bool = False
    retransmit_deadline_us: int = DEFAULT_RETRANSMIT_DEADLINE_US

    def __post_init__(self) -> None:
        if self.max_buffered < 1:
            raise ConfigError(f"max_buffered must be at least 1, got {self.max_buffered}")
        if not self.jitter_multiplier > 0:
            raise ConfigError(f"jitter_multiplier must be positive, got {self.jitter_multiplier}")
        if self.min_hold_us < 0 or self.max_hold_us < self.min_hold_us:
            raise ConfigError(
                f"need 0 <= min_hold_us <= max_hold_us, got {self.min_hold_us}, {self.max_hold_us}"
            )
        if self.retransmit_deadline_us < 0:
            raise ConfigError(f"retransmit_deadline_us must be >= 0, got {self.retransmit_deadline_us}")


class GapReason(Enum):
    """Why a gap was skipped."""

    DEADLINE = "deadline"  # a later message waited its full hold
    OVERFLOW = "overflow"  # more than max_buffered entries were held
    FLUSH = "flush"  # the caller flushed the buffer (e.g. the session closed)


@dataclass(frozen=True, slots=True)
class Delivered(Generic[T]):
    """Deliver ``item`` (msg_id ``msg_id``) now; events come in msg_id order."""

    msg_id: int
    item: T


@dataclass(frozen=True, slots=True)
class GapSkipped:
    """Ids ``first_missing`` to ``last_missing`` (inclusive, serial order) are given up.

    ``count`` is how many ids that is; ``last_missing`` may be numerically below
    ``first_missing`` when the range wraps at ``2**64``.
    """

    first_missing: int
    last_missing: int
    count: int
    reason: GapReason


@dataclass(frozen=True, slots=True)
class Late(Generic[T]):
    """``msg_id`` is behind the delivery point (delivered, skipped or in a reported gap); not delivered."""

    msg_id: int
    item: T


@dataclass(frozen=True, slots=True)
class Duplicate(Generic[T]):
    """``msg_id`` is already held in the buffer; this copy is not delivered."""

    msg_id: int
    item: T


#: What :meth:`ReorderBuffer.push` and :meth:`ReorderBuffer.poll` give back: a delivery, a gap, a late
#: message or a duplicate.
ReorderEvent: TypeAlias = Delivered[T] | GapSkipped | Late[T] | Duplicate[T]


@dataclass(slots=True)
class _Entry(Generic[T]):
    msg_id: int
    item: T | None
    skipped: bool
    deadline_us: int


class ReorderBuffer(Generic[T]):
    """Per-session reorder buffer; see the module docstring for the semantics.

    ``first_id`` is the msg_id delivery starts at. If it is None (the default),
    the buffer cannot know whether an earlier id is still on its way, so the
    first arrival is held for one hold time like any out-of-order message; the
    lowest id that arrived by then becomes the start, and no gap is reported
    before it. A node that knows a session is new passes ``first_id=1`` and pays
    no delay.

    Internally, ids are unwrapped to unbounded integers relative to an anchor
    (the next expected id), so ordering never sees the wrap.
    """

    def __init__(self, config: ReorderConfig | None = None, first_id: int | None = None) -> None:
        self._config = config if config is not None else ReorderConfig()
        if first_id is not None and not 0 <= first_id <= _MASK64:
            raise ConfigError(f"first_id must be an unsigned 64-bit integer, got {first_id}")
        # Anchor for unwrapping: wire id _anchor_id is unwrapped id _anchor_abs.
        self._anchor_id = first_id if first_id is not None else 0
        self._anchor_abs = 0
        self._next_abs: int | None = 0 if first_id is not None else None
        self._held: dict[int, _Entry[T]] = {}
        self._order: list[int] = []  # min-heap of held unwrapped ids
        self._deadlines: list[tuple[int, int]] = []  # min-heap of (deadline_us, unwrapped id); lazy
        self._jitter_us = 0.0
        self._last_transit_us: int | None = None

    # --- inputs ------------------------------------------------------------------------------

    def push(self, msg_id: int, item: T, now_us: int, sent_us: int | None = None) -> list[ReorderEvent[T]]:
        """Add a message; return what is released now.

        ``sent_us`` is the message's timestamp; with it, the jitter estimate is
        updated (without it, the hold stays as it is).
        """
        self._check_id(msg_id)
        if sent_us is not None:
            self._update_jitter(now_us - sent_us)
        return self._add(msg_id, item, False, now_us)

    def skip(self, msg_id: int, now_us: int) -> list[ReorderEvent[T]]:
        """Consume ``msg_id`` without an item (it was refused), so it does not hold the buffer."""
        self._check_id(msg_id)
        return self._add(msg_id, None, True, now_us)

    def poll(self, now_us: int) -> list[ReorderEvent[T]]:
        """Release whatever has waited its hold time by ``now_us``."""
        events: list[ReorderEvent[T]] = []
        self._release_due(now_us, events)
        return events

    def flush(self) -> list[ReorderEvent[T]]:
        """Release everything held, in order, reporting gaps (e.g. when the session closes)."""
        events: list[ReorderEvent[T]] = []
        if self._order:
            self._release_through(max(self._held), GapReason.FLUSH, events)
        return events

    # --- state -------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When :meth:`poll` next has something to release, or None if nothing is held."""
        while self._deadlines:
            _, abs_id = self._deadlines[0]
            if abs_id in self._held:
                return self._deadlines[0][0]
            heapq.heappop(self._deadlines)
        return None

    @property
    def config(self) -> ReorderConfig:
        return self._config

    @property
    def jitter_us(self) -> float:
        """Smoothed transit jitter ``J`` in microseconds."""
        return self._jitter_us

    @property
    def hold_us(self) -> int:
        """How long a message that arrives now may wait for a gap before it."""
        c = self._config
        if c.reliable:
            return c.retransmit_deadline_us
        hold = int(c.jitter_multiplier * self._jitter_us)
        return min(max(hold, c.min_hold_us), c.max_hold_us)

    @property
    def next_expected(self) -> int | None:
        """The msg_id delivered next, or None while the start is not decided."""
        if self._next_abs is None:
            return None
        return self._to_id(self._next_abs)

    def __len__(self) -> int:
        """How many entries (messages and skipped ids) are held."""
        return len(self._held)

    # --- internals ---------------------------------------------------------------------------

    @staticmethod
    def _check_id(msg_id: int) -> None:
        if not 0 <= msg_id <= _MASK64:
            raise ConfigError(f"msg_id must be an unsigned 64-bit integer, got {msg_id}")

    def _update_jitter(self, transit_us: int) -> None:
        if self._last_transit_us is not None:
            d = abs(transit_us - self._last_transit_us)
            self._jitter_us += (d - self._jitter_us) / 16
        self._last_transit_us = transit_us

    def _to_abs(self, msg_id: int) -> int:
        return self._anchor_abs + serial_diff(msg_id, self._anchor_id)

    def _to_id(self, abs_id: int) -> int:
        return (self._anchor_id + (abs_id - self._anchor_abs)) & _MASK64

    def _add(self, msg_id: int, item: T | None, skipped: bool, now_us: int) -> list[ReorderEvent[T]]:
        events: list[ReorderEvent[T]] = []
        if self._next_abs is None and not self._held:
            self._anchor_id, self._anchor_abs = msg_id, 0  # first arrival anchors the unwrapping
        abs_id = self._to_abs(msg_id)
        next_abs = self._next_abs
        if next_abs is not None and abs_id < next_abs:
            if not skipped:
                events.append(Late(msg_id, cast(T, item)))
        elif abs_id in self._held:
            if not skipped:
                events.append(Duplicate(msg_id, cast(T, item)))
        elif abs_id == next_abs:
            self._emit(_Entry(msg_id, item, skipped, now_us), events)
            self._next_abs = next_abs + 1
            self._release_contiguous(events)
        else:
            deadline = now_us + self.hold_us
            self._held[abs_id] = _Entry(msg_id, item, skipped, deadline)
            heapq.heappush(self._order, abs_id)
            heapq.heappush(self._deadlines, (deadline, abs_id))
            if len(self._deadlines) > 2 * len(self._held) + 16:
                self._compact_deadlines()
        while len(self._held) > self._config.max_buffered:
            self._release_through(self._order[0], GapReason.OVERFLOW, events)
        self._release_due(now_us, events)
        return events

    def _compact_deadlines(self) -> None:
        self._deadlines = [(e.deadline_us, a) for a, e in self._held.items()]
        heapq.heapify(self._deadlines)

    def _release_due(self, now_us: int, events: list[ReorderEvent[T]]) -> None:
        while self._deadlines and self._deadlines[0][0] <= now_us:
            _, abs_id = heapq.heappop(self._deadlines)
            if abs_id in self._held:
                self._release_through(abs_id, GapReason.DEADLINE, events)

    def _release_through(self, target_abs: int, reason: GapReason, events: list[ReorderEvent[T]]) -> None:
        """Advance delivery through ``target_abs`` (which is held), reporting gaps, then go on in order."""
        # If the start was not known, it is the lowest id that arrived, with no gap before it.
        next_abs = self._order[0] if self._next_abs is None else self._next_abs
        while next_abs <= target_abs:
            lowest = self._order[0]
            if lowest > next_abs:
                events.append(
                    GapSkipped(self._to_id(next_abs), self._to_id(lowest - 1), lowest - next_abs, reason)
                )
                next_abs = lowest
            heapq.heappop(self._order)
            self._emit(self._held.pop(lowest), events)
            next_abs += 1
        self._next_abs = next_abs
        self._release_contiguous(events)

    def _release_contiguous(self, events: list[ReorderEvent[T]]) -> None:
        next_abs = self._next_abs
        if next_abs is None:
            return
        while self._order and self._order[0] == next_abs:
            heapq.heappop(self._order)
            self._emit(self._held.pop(next_abs), events)
            next_abs += 1
        self._next_abs = next_abs
        # Re-anchor at the delivery point so unwrapping stays within 2**63 of it.
        self._anchor_id, self._anchor_abs = self._to_id(next_abs), next_abs

    @staticmethod
    def _emit(entry: _Entry[T], events: list[ReorderEvent[T]]) -> None:
        if not entry.skipped:
            events.append(Delivered(entry.msg_id, cast(T, entry.item)))
