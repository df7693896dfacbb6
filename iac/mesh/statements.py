"""Key rotation and revocation statements between peers: taking note of one, telling peers.

A node that rotates or revokes its key tells the registries and its connected peers; a peer
that receives the statement (a one-way REGISTER_KEY) verifies it against what its
:class:`~iac.KeyBook` knows, remembers it, and gives the successor the rotated key's addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from iac.errors import IacError
from iac.mesh.keybook import KeyBook, move_peer
from iac.mesh.wire import OP_REVOKE, OP_ROTATE, handler_error, payload_field
from iac.node.node import Node
from iac.protocol.records import SignedRevocation, SignedRotation
from iac.wire.enums import MessageType


def note_statement(book: KeyBook, node: Node, payload: dict[str, Any], now_us: int) -> dict[str, Any]:
    """Verify a rotation or revocation (a registry message's payload), remember it in ``book`` and,
    for a rotation, give the successor the old key's peer-book addresses on ``node``. The answer
    names the statement; :class:`HandlerError` when it does not verify."""
    try:
        if payload["op"] == OP_ROTATE:
            st = book.note_rotation(SignedRotation.from_json_obj(payload_field(payload, "rotation")), now_us)
            move_peer(node, st.old_agent_id, st.new_agent_id)
            return {"op": OP_ROTATE, "old_agent_id": st.old_agent_id, "new_agent_id": st.new_agent_id,
                    "seq": st.seq}  # fmt: skip
        rev = book.note_revocation(
            SignedRevocation.from_json_obj(payload_field(payload, "revocation")), now_us
        )
        return {"op": OP_REVOKE, "agent_id": rev.agent_id, "seq": rev.seq}
    except IacError as exc:
        raise handler_error(exc) from None


async def announce(node: Node, payload: dict[str, Any], peers: Iterable[str], *, timeout: float) -> None:
    """Send a statement to each of ``peers`` that ``node`` is connected to (one-way REGISTER_KEY,
    ACK_REQUESTED) and wait, up to ``timeout``, until they acknowledged it (a peer that fails is
    skipped)."""
    connected = [p for p in peers if node.connected(p)]

    async def one(peer: str) -> None:
        with contextlib.suppress(IacError, TimeoutError):
            sent = await node.send(peer, MessageType.REGISTER_KEY, payload, ack=True)
            await asyncio.wait_for(sent.wait(), timeout)

    await asyncio.gather(*(one(p) for p in connected))


__all__ = ["announce", "note_statement"]
