"""Opening received MESSAGE frames (the field-8 scan, parse and Ed25519 verification), one at a
time on the event loop or in batches on a worker thread.

PyNaCl releases the GIL while it verifies, so a batch opened on the worker thread uses a second
core while the loop goes on with the transport. A lone frame is opened right on the loop: a thread
hop would cost more than the verification. Results come back in the order of the frames.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence

from iac.errors import IacError, WorkerFailed
from iac.node.pipeline import ReceivePipeline
from iac.wire._pb.iac_pb2 import Message

log = logging.getLogger("iac.node")

#: What opening one frame gives: the verified message, or the typed error that refused it.
Opened = Message | IacError


def open_all(bodies: Sequence[bytes], peer: str) -> list[Opened]:
    """Open each body as a MESSAGE from ``peer``; a refusal is returned in its place, in order."""
    out: list[Opened] = []
    for body in bodies:
        try:
            out.append(ReceivePipeline.open(body, peer))
        except IacError as exc:
            out.append(exc)
    return out


class Verifier:
    """Opens frames for one node. ``threaded``: batches of two or more go to one worker thread."""

    def __init__(self, *, threaded: bool = True, batch_min: int = 2) -> None:
        self.threaded = threaded
        self.batch_min = batch_min
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.batches = 0
        self.offloaded = 0

    async def open(self, bodies: Sequence[bytes], peer: str) -> list[Opened]:
        if not self.threaded or len(bodies) < self.batch_min:
            return open_all(bodies, peer)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="iac-verify")
        self.batches += 1
        self.offloaded += len(bodies)
        try:
            job = asyncio.get_running_loop().run_in_executor(self._pool, open_all, bodies, peer)
        except (RuntimeError, concurrent.futures.BrokenExecutor) as exc:  # shut down, or broken
            raise WorkerFailed(f"the verification worker cannot take work: {exc}") from exc
        return await job

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["Opened", "Verifier", "open_all"]
