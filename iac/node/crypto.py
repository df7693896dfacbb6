"""The node's one worker thread for Ed25519 batches (:class:`CryptoWorker`), under both the send
side (:mod:`iac.node.sign`) and the receive side (:mod:`iac.node.verify`): verifying and signing
share it, so their jobs run in the order they were given.

A worker that cannot take work (shut down, or its thread could not start) says so
(:attr:`CryptoWorker.available` False, with a warning once) and its callers do the work on the
loop; a job that raised is a :class:`~iac.errors.LocalError` (reason ``worker_failed``), never a
wait without end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TypeVar

from iac.errors import LocalError

log = logging.getLogger("iac.node")

T = TypeVar("T")


class CryptoWorker:
    """The node's one thread for Ed25519 batches (verifying and signing share it, so their jobs run
    in the order they were given); started at first use."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._broken = False

    @property
    def available(self) -> bool:
        """False once the worker was shut down or could not take work: do it on the loop."""
        return not (self._closed or self._broken)

    def submit(self, what: str, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread; ``worker_failed`` if it cannot take work."""
        if self._closed:
            raise LocalError(f"the {what} worker cannot take work: it was shut down", reason="worker_failed")
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="iac-crypto")
        try:
            return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except (RuntimeError, concurrent.futures.BrokenExecutor) as exc:  # shut down, or broken
            if not self._broken:
                log.warning("the %s worker cannot take work (%s): Ed25519 runs on the event loop", what, exc)
            self._broken = True
            raise LocalError(f"the {what} worker cannot take work: {exc}", reason="worker_failed") from exc

    async def run(self, what: str, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the thread and wait for it; whatever it raises is a worker_failed."""
        job = self.submit(what, fn, *args)
        try:
            return await job
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise LocalError(
                f"the {what} worker failed: {type(exc).__name__}: {exc}", reason="worker_failed"
            ) from exc

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["CryptoWorker"]
