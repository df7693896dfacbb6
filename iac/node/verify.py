"""Ed25519 off the event loop: opening received MESSAGE frames (the field-8 scan, parse and
verification) and signing outgoing messages, one at a time on the loop or in batches on the node's
one worker thread (:class:`~iac.node.crypto.CryptoWorker`).

PyNaCl releases the GIL while it signs or verifies, so a batch on the worker thread uses a second
core while the loop goes on with the transport. A lone frame is opened (and a lone message signed,
:mod:`iac.node.sign`) right on the loop: a thread hop would cost more than the operation. Results
come back in the order of the frames. A worker that cannot take work (shut down, or its thread
could not start) hands Ed25519 back to the loop, with a warning; a job that raised is a
``worker_failed`` for the caller (the read loop closes that connection with
INTERNAL_ERROR), never a wait without end.
"""

from __future__ import annotations

from collections.abc import Sequence

from iac.errors import IacError, ProtocolError
from iac.node.crypto import CryptoWorker
from iac.wire._pb.iac_pb2 import Message
from iac.wire.message import open_message, sender_of

#: What opening one frame gives: the verified message, or the typed error that refused it.
Opened = Message | IacError


def open_frame(body: bytes, peer: str) -> Message:
    """A MESSAGE frame's body: the field-8 scan, parse, ``from`` and signature (raise
    :class:`~iac.errors.MessageRejected` for a well-formed message that fails them, another
    :class:`~iac.errors.ProtocolError` for a malformed one); then the sender must be the peer
    whose HELLO proved this connection (``impersonation``: other origins travel
    inside FORWARD)."""
    msg = open_message(body)
    if getattr(msg, "from") != peer:
        _impersonation(msg, peer)
    return msg


def _impersonation(msg: Message, peer: str) -> None:
    sender = sender_of(msg)
    raise ProtocolError(
        f"MESSAGE from {sender[:16]}… on a connection whose HELLO proved "
        f"{peer[:16]}… (other origins travel inside FORWARD)",
        reason="impersonation",
    )


def open_all(bodies: Sequence[bytes], peer: str) -> list[Opened]:
    """Open each body as a MESSAGE from ``peer`` (:func:`open_frame`); a refusal is returned in
    its place, in order."""
    out: list[Opened] = []
    for body in bodies:
        try:
            msg = open_message(body)
            if getattr(msg, "from") != peer:
                _impersonation(msg, peer)
            out.append(msg)
        except IacError as exc:
            out.append(exc)
    return out


class Verifier:
    """Opens frames for one node. ``threaded``: batches of ``batch_min`` or more go to ``worker``."""

    def __init__(self, worker: CryptoWorker, *, threaded: bool = True, batch_min: int = 2) -> None:
        self.worker = worker
        self.threaded = threaded
        self.batch_min = batch_min
        self.batches = 0
        self.offloaded = 0

    def open_now(self, bodies: Sequence[bytes], peer: str) -> list[Opened] | None:
        """Open ``bodies`` right here, when they are not for the worker (a lone frame, no
        worker); None when they are: then :meth:`offload` them (the read loop awaits only that)."""
        if not self.threaded or len(bodies) < self.batch_min or not self.worker.available:
            return open_all(bodies, peer)
        return None

    async def open(self, bodies: Sequence[bytes], peer: str) -> list[Opened]:
        """Open ``bodies``: right here, or on the worker (:meth:`open_now`, :meth:`offload`)."""
        opened = self.open_now(bodies, peer)
        return opened if opened is not None else await self.offload(bodies, peer)

    async def offload(self, bodies: Sequence[bytes], peer: str) -> list[Opened]:
        """Open ``bodies`` on the worker (what :meth:`open_now` left to it)."""
        self.batches += 1
        self.offloaded += len(bodies)
        return await self.worker.run("verification", open_all, bodies, peer)


__all__ = ["Opened", "Verifier", "open_all", "open_frame"]
