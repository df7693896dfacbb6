"""Receive-side memory budgets: one per node, one per connection drawing from it.

Every byte a peer makes a connection hold on its way in is counted before the
connection reads further: bytes of a partly received frame, a received frame not
yet judged, a frame waiting for ``recv()`` (counted at its *decompressed* size, though
it waits compressed), and the frames last handed to ``recv()`` (until the next
``recv()``, when the reader is done with them).

* :class:`MemoryBudget` is the node-wide cap (``TransportConfig.memory_budget_bytes``):
  one object shared by every connection that uses the same :class:`TransportConfig`
  (a node's listeners and dials).
* :class:`RecvBudget` is one connection's share (``recv_budget_bytes``). A connection
  that cannot take budget stops reading (TLS/TCP and UNIX sockets) or grants no new
  stream credit (QUIC), which pushes back on its peer; it reads again once budget
  comes back, as readers take frames.

Sans-IO: no event loop; a connection waiting for node budget registers a callback.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from iac.errors import ConfigError

#: Shortest time between two garbage collections run to reclaim leased budget (seconds).
RECLAIM_INTERVAL = 0.25


class MemoryBudget:
    """Bytes held by all the connections of one node, against ``limit``.

    ``take`` always succeeds (bytes that already arrived are counted even past the
    cap); ``room_for`` says whether more fits. ``returnable`` is the part that readers
    will give back (frames waiting for ``recv()`` or handed out by it): while it is 0,
    waiting cannot free anything, so anything fits (the liveness rule; what the peers
    can send meanwhile is bounded per connection). Connections that found the budget
    spent wait with :meth:`notify`; every ``give`` that leaves room calls them back.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ConfigError("memory_budget_bytes must be positive")
        self.limit = limit
        self.used = 0
        self.returnable = 0
        #: Part of ``returnable``: frames handed out by connections that closed since, counted
        #: until their reader drops them (:meth:`lease`).
        self.leased = 0
        #: The most ever held at once; garbage collections run by :meth:`reclaim`.
        self.peak = 0
        self.collections = 0
        self._last_gc = float("-inf")
        self._waiters: dict[Callable[[], None], None] = {}

    @property
    def spent(self) -> bool:
        """Nothing more fits, and readers will give budget back."""
        return self.used >= self.limit and self.returnable > 0

    def room_for(self, n: int) -> bool:
        return n <= 0 or self.used + n <= self.limit or self.returnable == 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def give(self, n: int) -> None:
        self.used -= n
        if self._waiters and (self.used < self.limit or self.returnable == 0):
            waiters = list(self._waiters)
            self._waiters.clear()
            for callback in waiters:
                callback()

    def lease(self, n: int) -> None:
        """``n`` returnable bytes are frames a closed connection handed out: they come back
        (:meth:`settle`) when the reader drops them."""
        self.leased += n

    def settle(self, n: int) -> None:
        """``n`` leased bytes came back (the reader dropped the frames)."""
        self.leased -= n
        self.returnable -= n
        self.give(n)

    def reclaim(self, now: float) -> bool:
        """The budget is spent and a good part of it is leased: frames a reader dropped may be
        kept only by reference cycles (an exception's traceback holding the frame that held
        them), which only the garbage collector frees. Collect (at most once every
        :data:`RECLAIM_INTERVAL` seconds of ``now``); True if it did."""
        if self.leased < self.limit // 4 or now - self._last_gc < RECLAIM_INTERVAL:
            return False
        self._last_gc = now
        self.collections += 1
        gc.collect()
        return True

    def notify(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time budget is given back (below the cap, or
        with nothing left for readers to give back)."""
        self._waiters[callback] = None

    def forget(self, callback: Callable[[], None]) -> None:
        self._waiters.pop(callback, None)

    def __repr__(self) -> str:
        return f"MemoryBudget({self.used}/{self.limit})"


class RecvBudget:
    """One connection's share of a :class:`MemoryBudget`, capped at ``limit`` bytes.

    ``returnable`` (as for the node) is what this connection's reader will give back;
    while it is 0 one more frame fits whatever the cap (a frame that arrived must be
    judged for the connection to go on). After :meth:`release` (the connection
    closed) it holds nothing and counts nothing.
    """

    def __init__(self, limit: int, node: MemoryBudget) -> None:
        self.limit = limit
        self.node = node
        self.held = 0
        self.returnable = 0
        self.released = False

    @property
    def spent(self) -> bool:
        """This connection's share or the node's budget is used up: read no further."""
        return (self.held >= self.limit and self.returnable > 0) or self.node.spent

    def fits(self, n: int) -> bool:
        if n <= 0:
            return True
        own = self.held + n <= self.limit or self.returnable == 0
        return own and self.node.room_for(n)

    def try_take(self, n: int) -> bool:
        if not self.fits(n):
            return False
        self.take(n)
        return True

    def take(self, n: int) -> None:
        """Count ``n`` bytes (negative: give them back), whatever the cap."""
        if self.released or n == 0:
            return
        if n < 0:
            self.give(-n)
            return
        self.held += n
        self.node.take(n)

    def give(self, n: int) -> None:
        if self.released or n <= 0:
            return
        if n > self.held:
            n = self.held
        self.held -= n
        self.node.give(n)

    def lend(self, n: int) -> None:
        """``n`` held bytes are frames for the reader: it will give them back (:meth:`returned`)."""
        if self.released or n <= 0:
            return
        self.returnable += n
        self.node.returnable += n

    def returned(self, n: int) -> None:
        """The reader is done with ``n`` lent bytes."""
        if self.released or n <= 0:
            return
        if n > self.returnable:
            n = self.returnable
        self.returnable -= n
        self.node.returnable -= n
        self.give(n)

    def release(self, keep: int = 0) -> None:
        """Give back everything held but ``keep`` lent bytes (frames the reader still holds:
        :meth:`MemoryBudget.settle` gives them back later); count nothing from now on."""
        if not self.released:
            keep = min(keep, self.returnable)
            self.node.returnable -= self.returnable - keep
            held, self.held, self.returnable = self.held - keep, 0, 0
            self.released = True
            self.node.give(held)


__all__ = ["RECLAIM_INTERVAL", "MemoryBudget", "RecvBudget"]
