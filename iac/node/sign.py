"""Signing outgoing messages: on the loop, or in batches on the node's crypto worker thread.

A message is signed on the loop as long as one task at a time sends (a request at 1 in flight, the
answers a read loop writes one after another): a thread hop would cost more than the 16 µs of one
signature. Once two different tasks sign in one turn of the event loop (many requests in flight,
concurrent handlers) the signer batches: what is signed in a turn goes to the worker thread
together (:class:`~iac.node.crypto.CryptoWorker`, shared with verification), where PyNaCl runs
without the GIL, so a second core does the Ed25519 while the loop goes on. After
``idle_turns`` batches in a row too small to send, it goes back to signing on the loop.

A worker that cannot take work hands signing back to the loop; a batch whose job raised fails
its senders with ``worker_failed``. Order is kept: batches finish in the order
they were made (one worker thread, and a small batch waits behind a batch still out), and each
batch wakes its senders in the order they signed, so what one connection sends leaves in the
order it was signed. The protobuf message itself never leaves the loop: the worker signs its
bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

from iac.errors import ConfigError, LocalError
from iac.node.crypto import CryptoWorker
from iac.wire._pb.iac_pb2 import Message
from iac.wire.identity import Domain, Identity
from iac.wire.message import sender_of, sign_message

#: One batch: the unsigned bytes of each message and the future its sender waits on.
_Batch = list[tuple[bytes, "asyncio.Future[bytes]"]]


def sign_all(identity: Identity, unsigned: Sequence[bytes]) -> list[bytes]:
    """The signatures of ``unsigned`` (each a message serialized with ``signature`` empty)."""
    return [identity.sign(Domain.MESSAGE, data) for data in unsigned]


class Signer:
    """Signs this node's messages (``worker`` None: always on the loop)."""

    def __init__(
        self, identity: Identity, worker: CryptoWorker | None, *, batch_min: int = 2, idle_turns: int = 8
    ) -> None:
        self.identity = identity
        self.worker = worker
        self.batch_min = batch_min
        self.idle_turns = idle_turns
        #: Batching (two tasks signed in one turn) or signing each message on the loop.
        self.batching = False
        self.batches = 0  # batches signed on the worker
        self.offloaded = 0  # messages signed there
        self._pending: _Batch = []
        self._out = 0  # batches on the worker, not back yet
        self._small = 0  # batches in a row too small to send to the worker
        self._turn_task: asyncio.Task[object] | None = None
        self._turn_tasks = 0
        self._turn_marked = False

    async def sign(self, msg: Message) -> bytes:
        """Sign ``msg`` in place and return its signed bytes."""
        if self.worker is None or (not self.worker.available and not self._out and not self._pending):
            return sign_message(self.identity, msg)
        if not self.batching:
            self._note_turn()
            return sign_message(self.identity, msg)
        if sender_of(msg) != self.identity.agent_id:
            raise ConfigError("a message must be signed by the identity in its `from` field")
        msg.signature = b""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending.append((msg.SerializeToString(deterministic=True), fut))
        if len(self._pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        msg.signature = await fut
        return msg.SerializeToString(deterministic=True)

    def _note_turn(self) -> None:
        """Count the tasks that sign in this turn of the loop; two or more start batching."""
        task = asyncio.current_task()
        if not self._turn_marked:
            self._turn_marked = True
            self._turn_task, self._turn_tasks = task, 1
            asyncio.get_running_loop().call_soon(self._end_turn)
        elif task is not self._turn_task:
            self._turn_task = task
            self._turn_tasks += 1

    def _end_turn(self) -> None:
        if self._turn_tasks >= 2:
            self.batching, self._small = True, 0
        self._turn_marked, self._turn_task, self._turn_tasks = False, None, 0

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if len(batch) < self.batch_min and not self._out:
            self._small += 1
            if self._small >= self.idle_turns:
                self.batching = False
            for data, fut in batch:
                if not fut.done():
                    fut.set_result(self.identity.sign(Domain.MESSAGE, data))
            return
        if len(batch) >= self.batch_min:
            self._small = 0
        assert self.worker is not None
        try:
            job = self.worker.submit("signing", sign_all, self.identity, [data for data, _ in batch])
        except LocalError as exc:  # it cannot take work: sign this batch here (later ones too: sign())
            if exc.reason != "worker_failed":
                raise
            for data, fut in batch:
                if not fut.done():
                    fut.set_result(self.identity.sign(Domain.MESSAGE, data))
            return
        self._out += 1
        self.batches += 1
        self.offloaded += len(batch)
        job.add_done_callback(partial(self._done, batch))

    def _done(self, batch: _Batch, job: asyncio.Future[list[bytes]]) -> None:
        self._out -= 1
        if job.cancelled():
            self._fail(batch, LocalError("the signing worker was shut down", reason="worker_failed"))
            return
        exc = job.exception()
        if exc is not None:
            self._fail(
                batch,
                LocalError(f"the signing worker failed: {type(exc).__name__}: {exc}", reason="worker_failed"),
            )
            return
        for (_, fut), signature in zip(batch, job.result(), strict=True):
            if not fut.done():
                fut.set_result(signature)

    @staticmethod
    def _fail(batch: _Batch, exc: LocalError) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(exc)


__all__ = ["Signer", "sign_all"]
