"""Event loops for the benchmarks: the stdlib asyncio loop or uvloop, chosen per contender. A
contender named ``…-uvloop`` runs its server process on uvloop (:func:`run`) and its client on a
uvloop loop in a thread of its own (:class:`Lane`), while the benchmark's own loop waits for it."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

UVLOOP_SUFFIX = "-uvloop"
LOOPS = ("asyncio", "uvloop")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_kind(name: str) -> str:
    """``uvloop`` for a contender named ``…-uvloop``, else ``asyncio``."""
    return "uvloop" if name.endswith(UVLOOP_SUFFIX) else "asyncio"


def base_name(name: str) -> str:
    """The contender without its loop suffix: ``iac-tls-uvloop`` -> ``iac-tls``."""
    return name.removesuffix(UVLOOP_SUFFIX)


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Callable[[], Coroutine[Any, Any, T]], kind: str) -> T:
    """``asyncio.run(main())`` on a loop of ``kind``."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main())


class Lane:
    """Where a contender's client runs: the caller's loop (``kind`` asyncio), or a loop of
    ``kind`` in its own thread. ``await lane.run(coro)`` runs ``coro`` there."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if kind != "asyncio":
            self.loop = loop_factory(kind)()
            self._thread = threading.Thread(target=self.loop.run_forever, name=f"lane-{kind}", daemon=True)
            self._thread.start()

    async def run(self, coro: Awaitable[T]) -> T:
        if self.loop is None:
            return await coro

        async def wrap() -> T:
            return await coro

        fut = asyncio.run_coroutine_threadsafe(wrap(), self.loop)
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        if self.loop is None or self._thread is None:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
