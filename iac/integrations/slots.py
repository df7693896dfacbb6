"""Bounds per client and in total for the HTTP endpoints a node serves (the metrics endpoint, the
A2A gateway), with no I/O inside: :class:`AddressSlots` counts connections per client address and
in total, :class:`ByteBudget` counts bytes held per client and in total, :class:`RefusalLog` logs
refusals at most once per interval with how many there were. Time is an argument (``now``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable


class AddressSlots:
    """At most ``total`` connections at once, at most ``per_address`` of them from one client
    address. :meth:`take` answers None (taken) or why not (``"per_address"``, ``"total"``)."""

    def __init__(self, total: int, per_address: int) -> None:
        if total < 1 or per_address < 1:
            raise ValueError("slot bounds are at least 1")
        self.total = total
        self.per_address = per_address
        self.held: Counter[Hashable] = Counter()
        self.in_use = 0
        #: Connections refused, by reason.
        self.refused: Counter[str] = Counter()

    def take(self, address: Hashable) -> str | None:
        if self.in_use >= self.total:
            reason = "total"
        elif self.held[address] >= self.per_address:
            reason = "per_address"
        else:
            self.held[address] += 1
            self.in_use += 1
            return None
        self.refused[reason] += 1
        return reason

    def give(self, address: Hashable) -> None:
        n = self.held[address]
        if n <= 0:
            return
        if n == 1:
            del self.held[address]
        else:
            self.held[address] = n - 1
        self.in_use -= 1


class ByteBudget:
    """At most ``total`` bytes held at once, at most ``per_client`` of them by one client."""

    def __init__(self, total: int, per_client: int) -> None:
        if total < 1 or per_client < 1:
            raise ValueError("byte bounds are at least 1")
        self.total = total
        self.per_client = per_client
        self.held: Counter[Hashable] = Counter()
        self.in_use = 0
        #: Requests refused because their bytes did not fit, by reason.
        self.refused: Counter[str] = Counter()

    def take(self, client: Hashable, size: int) -> str | None:
        """Hold ``size`` more bytes for ``client``: None, or why not (``"per_client"``, ``"total"``)."""
        if self.in_use + size > self.total:
            reason = "total"
        elif self.held[client] + size > self.per_client:
            reason = "per_client"
        else:
            self.held[client] += size
            self.in_use += size
            return None
        self.refused[reason] += 1
        return reason

    def give(self, client: Hashable, size: int) -> None:
        size = min(size, self.held[client])
        if size <= 0:
            return
        self.held[client] -= size
        if not self.held[client]:
            del self.held[client]
        self.in_use -= size


class RefusalLog:
    """Logs a kind of refusal at most once per ``interval`` seconds, with the count since the last
    line, so a flood of refusals costs a counter increment each, not a log line each."""

    def __init__(self, logger: logging.Logger, what: str, interval: float = 10.0) -> None:
        self.logger = logger
        self.what = what
        self.interval = interval
        self.pending: Counter[str] = Counter()
        self.last: float | None = None
        #: Lines written.
        self.lines = 0

    def refused(self, reason: str, now: float) -> float | None:
        """Count a refusal; logs it now, or returns when :meth:`flush` should log what is pending
        (None: nothing waits, or a flush is due already)."""
        self.pending[reason] += 1
        if self.last is not None and now - self.last < self.interval:
            return self.last + self.interval if sum(self.pending.values()) == 1 else None
        self.flush(now)
        return None

    def flush(self, now: float) -> None:
        """Log the refusals counted since the last line, if any."""
        if not self.pending:
            return
        self.last = now
        counts = ", ".join(f"{n} {r}" for r, n in sorted(self.pending.items()))
        self.pending.clear()
        self.lines += 1
        self.logger.warning(
            "%s: refused connections (%s) since the last such line; at most one line per %g s",
            self.what,
            counts,
            self.interval,
            extra={"reason": "refused"},
        )


__all__ = ["AddressSlots", "ByteBudget", "RefusalLog"]
