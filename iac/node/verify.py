"""Ed25519 off the event loop: opening received MESSAGE frames (the field-8 scan, parse and
verification) and signing outgoing messages, one at a time on the loop or in batches on the node's
one worker thread (:class:`CryptoWorker`).

PyNaCl releases the GIL while it signs or verifies, so a batch on the worker thread uses a second
core while the loop goes on with the transport. A lone frame is opened (and a lone message signed,
:mod:`iac.node.sign`) right on the loop: a thread hop would cost more than the operation. Results
come back in the order of the frames. A worker that cannot take work (shut down, or its thread
could not start) hands Ed25519 back to the loop, with a warning; a job that raised is a
``worker_failed`` for the caller (the read loop closes that connection with
INTERNAL_ERROR), never a wait without end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from iac.errors import IacError, LocalError
from iac.node.pipeline import ReceivePipeline
from iac.wire._pb.iac_pb2 import Message

log = logging.getLogger("iac.node")

#: What opening one frame gives: the verified message, or the typed error that refused it.
Opened = Message | IacError
T = TypeVar("T")


def open_all(bodies: Sequence[bytes], peer: str) -> list[Opened]:
    """Open each body as a MESSAGE from ``peer``; a refusal is returned in its place, in order."""
    out: list[Opened] = []
    for body in bodies:
        try:
            out.append(ReceivePipeline.open(body, peer))
        except IacError as exc:
            out.append(exc)
    return out


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


class Verifier:
    """Opens frames for one node. ``threaded``: batches of ``batch_min`` or more go to ``worker``."""

    def __init__(self, worker: CryptoWorker, *, threaded: bool = True, batch_min: int = 2) -> None:
        self.worker = worker
        self.threaded = threaded
        self.batch_min = batch_min
        self.batches = 0
        self.offloaded = 0

    async def open(self, bodies: Sequence[bytes], peer: str) -> list[Opened]:
        if not self.threaded or len(bodies) < self.batch_min or not self.worker.available:
            return open_all(bodies, peer)
        self.batches += 1
        self.offloaded += len(bodies)
        return await self.worker.run("verification", open_all, bodies, peer)


__all__ = ["CryptoWorker", "Opened", "Verifier", "open_all"]
