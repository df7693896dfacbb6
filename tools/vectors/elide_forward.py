"""Write proto/testvectors/elide-forward-v1.json: compact FORWARD frames (``elide-forward/1``).

    .venv/bin/python -m tools.vectors.elide_forward

On a connection where both HELLOs announced ``elide-forward/1`` a sender may send a Forward
compact: the origin's AgentId once, as 32 raw bytes in field 4 (``origin``) or field 5
(``origin_to_receiver``: the inner ``to`` is the receiver and left out too), written first;
the inner message without its ``from`` (and ``to``); ``path`` without its first and last
entries. The receiver restores the whole Forward, then runs the checks of a received Forward.
Here bob relays to carol; each vector is the frame as it crosses (raw, no zstd), the whole
Forward carol restores (or the body as it is), and what carol's checks make of it. Fixed seeds
and fields, so the output is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from iac.protocol.routing.forward import wrap_forward
from iac.wire.elide import FORWARD_CAPABILITY, compact_forward, restore_forward
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, sign_message
from tools.vectors import render, write

ROOT = Path(__file__).resolve().parent.parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "elide-forward-v1.json"
VECTORS_VERSION = 1
#: The moment the vectors are checked at (their messages are stamped just before it).
NOW_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


def _identity(n: int) -> Identity:
    return Identity.from_seed(bytes((n * 0x11 + i) & 0xFF for i in range(32)))


def _signed(sender: Identity, to: str, msg_id: int, payload: dict[str, Any]) -> bytes:
    msg = build_message(
        sender=sender.agent_id,
        to=to,
        msg_type=MessageType.RUN if to else MessageType.BROADCAST,
        session=Session(0x1AC0_F0D0_0000_0001),
        timestamp_us=NOW_US - 1000 + msg_id,
        payload_json=json.dumps(payload, separators=(",", ":")),
        msg_id=msg_id,
    )
    return sign_message(sender, msg)


def _field(tag: int, value: bytes) -> bytes:
    return bytes((tag, len(value))) + value


def elide_forward_test_vectors() -> dict[str, Any]:
    alice, bob, carol, dave = _identity(1), _identity(2), _identity(3), _identity(4)
    a, b, c, d = (x.agent_id for x in (alice, bob, carol, dave))

    def vector(name: str, note: str, body: bytes, result: str) -> dict[str, Any]:
        restored = restore_forward(body, b, c)
        return {
            "name": name,
            "note": note,
            "frame_hex": encode_frame(FrameType.FORWARD, body).hex(),
            "compact": restored != body,
            "forward_hex": restored.hex(),
            "result": result,
        }

    to_carol = _signed(alice, c, 1, {"task": "summarize", "n": 1})
    to_dave = _signed(alice, d, 2, {"task": "summarize", "n": 2})
    flood = _signed(alice, "", 3, {"task": "announce"})
    own = _signed(bob, "", 4, {"task": "announce"})
    whole = wrap_forward(to_carol, 7, [a, b])
    compact = compact_forward(whole, b, c)
    onward = compact_forward(wrap_forward(to_dave, 7, [a, b]), b, c)
    # hostile: bob's compact frames changed after compaction
    key_a, key_d = bytes.fromhex(a), bytes.fromhex(d)
    rest = compact[34:]  # hop_limit, message (the inner message without from and to)
    vectors = [
        vector("to_receiver", "from, to and both path ends left out (field 5)", compact, "delivered"),
        vector("whole", "a sender may still send the whole Forward: kept as it is", whole, "delivered"),
        vector("onward", "`to` is another agent: kept; carol relays it to dave (field 4)", onward, "relayed"),
        vector(
            "broadcast",
            "no `to`: from and both path ends left out (field 4)",
            compact_forward(wrap_forward(flood, 15, [a, b]), b, c),
            "delivered",
        ),
        vector(
            "from_the_origin",
            "bob's own broadcast: path [bob] is the origin and the sender, nothing in `path`",
            compact_forward(wrap_forward(own, 16, [b]), b, c),
            "delivered",
        ),
        vector(
            "three_hops",
            "path [alice, dave, bob]: dave stays in `path`",
            compact_forward(wrap_forward(flood, 14, [a, d, b]), b, c),
            "delivered",
        ),
        vector(
            "origin_swapped",
            "dave's key in place of alice's: restored as dave's message, the signature fails",
            _field(0x2A, key_d) + rest,
            "bad_signature",
        ),
        vector(
            "redirected",
            "alice's message to dave compacted for dave (field 5), sent to carol: restored as to "
            "carol, the signature fails",
            compact_forward(wrap_forward(to_dave, 7, [a, b]), b, d),
            "bad_signature",
        ),
        vector(
            "receiver_in_path",
            "carol's id in `path`: restored [alice, carol, bob], a loop",
            _field(0x2A, key_a) + _field(0x12, c.encode()) + rest,
            "routing_loop",
        ),
        vector(
            "sender_in_path",
            "bob's id in `path` too: restored [alice, bob, bob], a repeat",
            _field(0x2A, key_a) + _field(0x12, b.encode()) + rest,
            "bad_forward_path",
        ),
        vector(
            "short_origin",
            "an origin of 31 bytes: not restored; a Forward with an origin field is malformed",
            _field(0x2A, key_a[:31]) + rest,
            "malformed_message",
        ),
        vector(
            "two_origins",
            "fields 4 and 5 both: not restored, malformed",
            _field(0x2A, key_a) + _field(0x22, key_a) + rest,
            "malformed_message",
        ),
        vector(
            "hop_limit_twice",
            "hop_limit twice: not restored; refused as in a whole Forward",
            _field(0x2A, key_a) + b"\x08\x07" + rest,
            "malformed_message",
        ),
    ]
    return {
        "version": VECTORS_VERSION,
        "description": "IAC FORWARD frames, compact (capability elide-forward/1), from bob to carol",
        "capability": FORWARD_CAPABILITY,
        "connection": {"sender": b, "receiver": c, "other": d, "now_us": NOW_US},
        "vectors": vectors,
    }


def render_elide_forward_vectors() -> str:
    """``elide_forward_test_vectors()`` as the exact text of the committed file."""
    return render(elide_forward_test_vectors())


def write_elide_forward_vectors(path: str | Path = VECTOR_FILE) -> None:
    """Rewrite the vector file (``python -m tools.vectors.elide_forward``)."""
    write(path, render_elide_forward_vectors())


if __name__ == "__main__":
    write_elide_forward_vectors()
