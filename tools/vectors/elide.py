"""Write proto/testvectors/elide-v1.json: MESSAGE frames with elided ``from``/``to``.

    .venv/bin/python -m tools.vectors.elide

On a direct connection where both HELLOs announced ``elide/1`` the sender may leave the
``from``/``to`` prefix out of a MESSAGE frame's body; the receiver restores it (the peer's
AgentId, then its own) when the body does not start with ``0x0a``, and the signature is
checked over the restored bytes. Fixed seeds and fields, frames sent raw (no zstd), so the
output is deterministic and independent of any compressor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from iac.wire.dicts import message_prefix
from iac.wire.elide import ELIDE_CAPABILITY, elide
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, sign_message
from tools.vectors import render, write

ROOT = Path(__file__).resolve().parent.parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "elide-v1.json"
VECTORS_VERSION = 1
_T0_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


def _identity(n: int) -> Identity:
    return Identity.from_seed(bytes((n * 0x11 + i) & 0xFF for i in range(32)))


def _signed(sender: Identity, to: str, msg_id: int, payload: dict[str, Any]) -> bytes:
    msg = build_message(
        sender=sender.agent_id,
        to=to,
        msg_type=MessageType.RUN,
        session=Session(0x1AC0_E11D_0000_0001),
        timestamp_us=_T0_US + msg_id,
        payload_json=json.dumps(payload, separators=(",", ":")),
        msg_id=msg_id,
    )
    return sign_message(sender, msg)


def elide_test_vectors() -> dict[str, Any]:
    alice, bob, carol = _identity(1), _identity(2), _identity(3)
    prefix = message_prefix(alice.agent_id, bob.agent_id)

    def vector(name: str, note: str, body: bytes, signed: bytes, result: str) -> dict[str, Any]:
        return {
            "name": name,
            "note": note,
            "frame_hex": encode_frame(FrameType.MESSAGE, body).hex(),
            "elided": body != signed,
            "message_hex": signed.hex(),
            "result": result,
        }

    to_bob = _signed(alice, bob.agent_id, 1, {"task": "summarize", "n": 1})
    to_carol = _signed(alice, carol.agent_id, 2, {"task": "summarize", "n": 2})
    no_to = _signed(alice, "", 3, {"task": "announce"})
    vectors = [
        vector("elided", "from/to left out; the receiver restores them", elide(to_bob, prefix), to_bob, "ok"),
        vector("full", "a sender may still send the whole message: kept as it is", to_bob, to_bob, "ok"),
        vector(
            "other_receiver",
            "`to` is not the peer: the prefix differs, nothing is left out",
            elide(to_carol, prefix),
            to_carol,
            "ok",
        ),
        vector("empty_to", "no `to`: nothing is left out", elide(no_to, prefix), no_to, "ok"),
        vector(
            "redirected",
            "a message to carol with its prefix cut, on the alice-bob connection: restored as to bob, "
            "the signature fails",
            to_carol[len(message_prefix(alice.agent_id, carol.agent_id)) :],
            prefix + to_carol[len(message_prefix(alice.agent_id, carol.agent_id)) :],
            "bad_signature",
        ),
    ]
    return {
        "version": VECTORS_VERSION,
        "description": "IAC MESSAGE frames on a direct connection with elided from/to (capability elide/1)",
        "capability": ELIDE_CAPABILITY,
        "connection": {
            "sender": alice.agent_id,
            "receiver": bob.agent_id,
            "prefix_hex": prefix.hex(),
        },
        "vectors": vectors,
    }


def render_elide_vectors() -> str:
    """``elide_test_vectors()`` as the exact text of the committed file."""
    return render(elide_test_vectors())


def write_elide_vectors(path: str | Path = VECTOR_FILE) -> None:
    """Rewrite the vector file (``python -m tools.vectors.elide``)."""
    write(path, render_elide_vectors())


if __name__ == "__main__":
    write_elide_vectors()
