"""The fallback dialer: reach a peer over the first of its addresses that works.

A peer has several addresses (``quic://h:p``, ``tls://h:p``, ``unix:///path``;
IPv4 and IPv6 hosts). The dialer tries them in the order given — the one that
worked last time for this peer first — with a per-attempt timeout. Like Happy
Eyeballs (RFC 8305), when an attempt has not finished after ``stagger`` seconds
the next one starts alongside it; an attempt that fails (refused, timed out, the
handshake refused) starts the next at once. The first verified connection wins;
the others are cancelled, or closed if they also got through. A policy pins one
transport or forbids some. When every attempt fails, one :class:`DialError`
lists each attempt and why.

:class:`Backoff` spaces out repeated dials (capped, jittered exponential
backoff) for callers that retry a peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from iac.errors import Attempt, CloseCode, ConfigError, DialError, IacError
from iac.transport.base import TRANSPORTS, Address, Connection, TransportConfig, parse_address
from iac.transport.endpoints import DEFAULT_CONFIG, dial
from iac.wire.identity import Identity


@dataclass(frozen=True)
class DialPolicy:
    """Which transports the dialer may use and how patient it is.

    ``pin``: use only this transport. ``forbid``: never use these.
    ``attempt_timeout``: one attempt (connect + TLS/QUIC + HELLO) may take this long, a
    QUIC attempt's wait for a handshake slot of its event loop included
    (``TransportConfig.quic_dial_concurrency``; the stagger then starts the next address).
    ``stagger``: start the next attempt when the current one is this slow.
    """

    pin: str | None = None
    forbid: frozenset[str] = frozenset()
    attempt_timeout: float = 3.0
    stagger: float = 0.25

    def __post_init__(self) -> None:
        for t in (self.pin, *self.forbid):
            if t is not None and t not in TRANSPORTS:
                raise ConfigError(f"unknown transport {t!r} (known: {', '.join(TRANSPORTS)})")
        if self.attempt_timeout <= 0 or self.stagger < 0:
            raise ConfigError("attempt_timeout must be positive and stagger not negative")

    def allows(self, transport: str) -> bool:
        if self.pin is not None and transport != self.pin:
            return False
        return transport not in self.forbid


DialFn = Callable[[Address, Identity, str | None, TransportConfig], Awaitable[Connection]]


async def _default_dial(
    addr: Address, identity: Identity, expect: str | None, config: TransportConfig
) -> Connection:
    return await dial(addr, identity, expect=expect, config=config)


@dataclass
class Dialer:
    """Dials peers by their address lists, remembering what worked per peer."""

    identity: Identity
    config: TransportConfig = DEFAULT_CONFIG
    policy: DialPolicy = field(default_factory=DialPolicy)
    #: How one attempt dials (tests inject fakes; default: :func:`iac.transport.dial`).
    dial_fn: DialFn = _default_dial
    #: Every attempt made, newest last (bounded; for diagnostics and tests).
    history: list[Attempt] = field(default_factory=list)
    _worked: dict[str, str] = field(default_factory=dict)

    def remembered(self, key: str) -> str | None:
        """The address that last worked for ``key`` (an AgentId or the address list)."""
        return self._worked.get(key)

    def plan(self, addresses: Sequence[str], key: str) -> list[Address]:
        """The addresses to try, in order, after the policy."""
        parsed = [parse_address(a) for a in addresses]
        allowed = [a for a in parsed if self.policy.allows(a.scheme)]
        worked = self._worked.get(key)
        if worked is not None:
            allowed.sort(key=lambda a: a.url != worked)  # stable: the rest keep their order
        return allowed

    async def dial(self, addresses: Sequence[str], expect: str | None = None) -> Connection:
        """Connect to the peer at the first address that works; :class:`DialError` if none."""
        key = expect or " ".join(addresses)
        target = f"{expect[:16]}…" if expect else (", ".join(addresses) or "peer")
        plan = self.plan(addresses, key)
        if not plan:
            shown = ", ".join(addresses) or "none"
            raise DialError(
                target, [], note=f"no address allowed by the transport policy (addresses: {shown})"
            )
        loop = asyncio.get_running_loop()
        attempts: list[Attempt] = []
        tasks: dict[asyncio.Task[Connection], tuple[Address, float]] = {}
        next_i = 0

        def start_next() -> None:
            nonlocal next_i
            addr = plan[next_i]
            next_i += 1
            coro = self.dial_fn(addr, self.identity, expect, self.config)
            task = loop.create_task(asyncio.wait_for(coro, self.policy.attempt_timeout))
            tasks[task] = (addr, time.monotonic())

        winner: Connection | None = None
        start_next()
        try:
            while tasks and winner is None:
                more = next_i < len(plan)
                done, _ = await asyncio.wait(
                    tasks, timeout=self.policy.stagger if more else None, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    start_next()  # the current attempts are slow: start the next alongside
                    continue
                for task in done:
                    addr, started = tasks.pop(task)
                    elapsed = time.monotonic() - started
                    exc = task.exception()
                    if exc is None and winner is None:
                        winner = task.result()
                        attempts.append(Attempt(addr.url, addr.scheme, "ok", "", elapsed))
                        self._worked[key] = addr.url
                    elif exc is None:
                        await task.result().close(CloseCode.GOING_AWAY, "another address won")
                    else:
                        attempts.append(_failed(addr, exc, elapsed, self.policy.attempt_timeout))
                if winner is None and next_i < len(plan):
                    start_next()  # a failure: move on at once
        finally:
            await _cancel_losers(tasks)
            self.history.extend(attempts)
            del self.history[:-256]
        if winner is None:
            raise DialError(target, attempts)
        return winner


def _failed(addr: Address, exc: BaseException, elapsed: float, timeout: float) -> Attempt:
    if isinstance(exc, TimeoutError):
        return Attempt(addr.url, addr.scheme, "timeout", f"no connection within {timeout:g} s", elapsed)
    if isinstance(exc, IacError):
        detail = str(exc).removeprefix(addr.url + ": ")
        return Attempt(addr.url, addr.scheme, exc.reason, detail, elapsed)
    return Attempt(addr.url, addr.scheme, type(exc).__name__, str(exc), elapsed)


async def _cancel_losers(tasks: dict[asyncio.Task[Connection], tuple[Address, float]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            conn = await task
            await conn.close(CloseCode.GOING_AWAY, "another address won")


@dataclass
class Backoff:
    """Capped exponential backoff with jitter: ``initial × factor**n``, at most
    ``maximum``, each delay scaled by a random factor in ``[1 − jitter, 1]``.
    Sleep ``next_delay()`` before each retry; ``reset()`` after a success."""

    initial: float = 0.1
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random)
    _n: int = 0

    def next_delay(self) -> float:
        base = min(self.maximum, self.initial * self.factor**self._n)
        self._n += 1
        return base * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        self._n = 0


__all__ = ["Attempt", "Backoff", "DialError", "DialFn", "DialPolicy", "Dialer"]
