"""Waiting for a condition with a deadline, for tests.

Prefer a real signal when there is one: an :class:`asyncio.Event` a handler sets,
a future a callback resolves, ``await sent.wait()``, a peer event. Some states
have no signal of their own (a counter in ``node.stats()``, a listener's refusal
count, what a relay has forwarded); :func:`eventually` polls those until they
hold and fails the test with an :class:`AssertionError` at its deadline, instead
of hanging until an outer timeout or guessing with a fixed sleep.
:func:`eventually_sync` is the same for blocking code (no event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds a condition gets by default. Generous: it bounds a wait for something that
#: normally happens in milliseconds, so a slow machine is not mistaken for a bug.
DEFAULT_TIMEOUT = 10.0


def _failure(timeout: float, message: str | Callable[[], str] | None) -> AssertionError:
    detail = message() if callable(message) else message
    text = f"condition not met within {timeout:g} s"
    return AssertionError(f"{text}: {detail}" if detail else text)


async def eventually(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    interval: float = 0.005,
    message: str | Callable[[], str] | None = None,
) -> T:
    """Wait until ``predicate()`` returns a true value and return that value.

    The predicate is checked at once, then every ``interval`` seconds; after
    ``timeout`` seconds an :class:`AssertionError` says so (with ``message``, or
    what ``message()`` returns, to show the state that was not reached)::

        await eventually(lambda: node.stats().routing["relayed"] == 2)
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() >= deadline:
            raise _failure(timeout, message)
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    interval: float = 0.02,
    message: str | Callable[[], str] | None = None,
) -> T:
    """:func:`eventually` for blocking code: polls with :func:`time.sleep` (never
    call it from a coroutine; it would stall the event loop)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(timeout, message)
        time.sleep(interval)


__all__ = ["DEFAULT_TIMEOUT", "eventually", "eventually_sync"]
