"""Write proto/testvectors/mesh-v1.json: FILE_TRANSFER chunks and acks, FORWARD wrappers.

    .venv/bin/python -m tools.vectors.mesh

Everything comes from fixed seeds, session ids and timestamps, so the output is deterministic
(docs/PROTOCOL.md describes the file).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from iac.protocol import files as ft
from iac.protocol.replay import DEFAULT_MAX_SKEW_US
from iac.protocol.routing import (
    DEFAULT_BROADCAST_HOP_LIMIT,
    DEFAULT_HOP_LIMIT,
    RouteRefusal,
    wrap_forward,
)
from iac.wire._pb.iac_pb2 import Forward, Message, MessageType
from iac.wire.identity import Domain, Identity, signing_input
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import Session, build_message, sign_message
from tools.vectors import points, render, write

ROOT = Path(__file__).resolve().parent.parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "mesh-v1.json"

MESH_VECTORS_VERSION = 1
#: Fixed inputs of the vectors (seeds are 32 bytes: one repeated byte).
_SEEDS = {"origin": 0x11, "relay": 0x22, "receiver": 0x33}
_VECTOR_TIME_US = 1_700_000_000_000_000


def mesh_test_vectors() -> dict[str, Any]:
    """The deterministic content of ``proto/testvectors/mesh-v1.json`` (see docs/PROTOCOL.md)."""
    ids = {role: Identity.from_seed(bytes([b]) * 32) for role, b in _SEEDS.items()}
    origin, relay, receiver = ids["origin"], ids["relay"], ids["receiver"]
    agents = {
        role: {"seed_hex": ident.seed().hex(), "agent_id": ident.agent_id} for role, ident in ids.items()
    }

    content = bytes(range(256)) * 8 + b"iac"  # 2051 bytes: two chunks of 1024 and one of 3
    chunk_size = 1024
    file_sha = hashlib.sha256(content).hexdigest()
    total = ft.chunk_count(len(content), chunk_size)
    chunks: list[dict[str, Any]] = []
    session = Session(session_id=0x0123456789ABCDEF)
    for index in range(total):
        data = content[index * chunk_size : (index + 1) * chunk_size]
        header = ft.ChunkHeader(
            "vector-transfer-1",
            "notes.txt",
            index,
            total,
            len(content),
            chunk_size,
            file_sha,
            hashlib.sha256(data).hexdigest(),
        )
        msg = build_message(
            sender=origin.agent_id,
            to=receiver.agent_id,
            msg_type=MessageType.FILE_TRANSFER,
            session=session,
            timestamp_us=_VECTOR_TIME_US + index,
            payload_json=header.to_json(),
            extra_data=data,
        )
        chunks.append(
            {
                "name": f"chunk {index}",
                "payload": json.loads(header.to_json()),
                "payload_json": header.to_json(),
                "extra_data_hex": data.hex(),
                "signed_hex": sign_message(origin, msg).hex(),
            }
        )
    acks = [
        ft.AckPayload("vector-transfer-1", ((0, 1),), ft.AckStatus.PARTIAL),
        ft.AckPayload("vector-transfer-1", ((0, 1), (2, 3)), ft.AckStatus.PARTIAL),
        ft.AckPayload("vector-transfer-1", ((0, 3),), ft.AckStatus.COMPLETE),
        ft.AckPayload(
            "vector-transfer-1",
            (),
            ft.AckStatus.FAILED,
            "file_hash_mismatch",
            "'notes.txt': the received file does not match its sha256",
        ),
        ft.AckPayload("vector-transfer-2", (), ft.AckStatus.UNKNOWN),
    ]
    base = json.loads(chunks[0]["payload_json"])

    def neg(name: str, change: dict[str, Any], data: bytes, error: str, drop: str = "") -> dict[str, Any]:
        obj = {**base, **change}
        if drop:
            del obj[drop]
        return {
            "name": name,
            "payload_json": dumps_compact(obj),
            "extra_data_hex": data.hex(),
            "max_size": 1 << 20,
            "error": error,
        }

    first = content[:chunk_size]
    tampered = bytes([first[0] ^ 1]) + first[1:]
    chunk_negative = [
        neg("absolute path", {"name": "/etc/passwd"}, first, "unsafe_file_name"),
        neg("parent directory", {"name": ".."}, first, "unsafe_file_name"),
        neg("path separator", {"name": "../outside.txt"}, first, "unsafe_file_name"),
        neg("backslash", {"name": "..\\outside.txt"}, first, "unsafe_file_name"),
        neg("NUL in name", {"name": "a\u0000b"}, first, "unsafe_file_name"),
        neg("hidden file", {"name": ".bashrc"}, first, "unsafe_file_name"),
        neg("empty name", {"name": ""}, first, "unsafe_file_name"),
        neg("name over 255 bytes", {"name": "é" * 128}, first, "unsafe_file_name"),
        neg("size over max_size", {"size": (1 << 20) + 1, "total": 1025}, first, "file_too_large"),
        neg("index not below total", {"index": 3}, first, "chunk_out_of_range"),
        neg("total inconsistent with size", {"total": 4}, first, "transfer_mismatch"),
        neg("chunk one byte short", {}, first[:-1], "bad_chunk_length"),
        neg("tampered chunk", {}, tampered, "chunk_hash_mismatch"),
        neg("chunk_size below 1024", {"chunk_size": 512, "total": 5}, first[:512], "bad_transfer_payload"),
        neg("index is a string", {"index": "0"}, first, "bad_transfer_payload"),
        neg("size is a float", {"size": 2051.0}, first, "bad_transfer_payload"),
        neg("sha256 uppercase", {"sha256": file_sha.upper()}, first, "bad_transfer_payload"),
        neg("transfer_id with a slash", {"transfer_id": "a/b"}, first, "bad_transfer_payload"),
        neg("no sha256", {}, first, "bad_transfer_payload", drop="sha256"),
    ]

    bsession = Session(session_id=0xFEDCBA9876543210)
    bmsg = build_message(
        sender=origin.agent_id,
        to="",
        msg_type=MessageType.BROADCAST,
        session=bsession,
        timestamp_us=_VECTOR_TIME_US,
        payload_json='{"topic":"status","text":"hello, mesh"}',
    )
    bcast = sign_message(origin, bmsg)
    umsg = build_message(
        sender=origin.agent_id,
        to=receiver.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=_VECTOR_TIME_US,
        payload_json='{"fn":"echo","args":{"x":1}}',
    )
    unicast = sign_message(origin, umsg)
    altered = bytearray(unicast)
    altered[unicast.index(b'"x":1') + 4] ^= 0x01  # 1 -> 0
    o, r, c = origin.agent_id, relay.agent_id, receiver.agent_id
    # a point of order 8 as origin: R = identity, S = 0 passes a plain cofactorless check
    order_8 = points.encode(points.ORDER_8).hex()
    small = Message(to=c, msg_type=MessageType.COMMAND, timestamp=_VECTOR_TIME_US, session_id=42)
    small.payload_json = umsg.payload_json
    setattr(small, "from", order_8)

    def small_input(msg_id: int) -> bytes:
        small.msg_id = msg_id
        return signing_input(Domain.MESSAGE, small.SerializeToString(deterministic=True))

    small_signed, small_sig, _ = points.forge_small_order(bytes.fromhex(order_8), small_input)
    forged = small_signed[len(Domain.MESSAGE.value) + 1 :] + Message(signature=small_sig).SerializeToString()

    def fwd(name: str, msg: bytes, hop_limit: int, path: list[str], desc: str) -> dict[str, Any]:
        return {
            "name": name,
            "description": desc,
            "hop_limit": hop_limit,
            "path": path,
            "message_hex": msg.hex(),
            "forward_hex": wrap_forward(msg, hop_limit, path).hex(),
        }

    forward = [
        fwd("broadcast, first hop", bcast, DEFAULT_BROADCAST_HOP_LIMIT, [o], "as the origin sends it"),
        fwd("broadcast, relayed once", bcast, DEFAULT_BROADCAST_HOP_LIMIT - 1, [o, r], "after one relay"),
        fwd("unicast via a relay, first hop", unicast, DEFAULT_HOP_LIMIT, [o], "origin to relay"),
        fwd("unicast via a relay, second hop", unicast, DEFAULT_HOP_LIMIT - 1, [o, r], "relay to receiver"),
    ]

    def fneg(name: str, body: bytes, from_peer: str, refusal: RouteRefusal, error: str) -> dict[str, Any]:
        return {
            "name": name,
            "receiver": "receiver",
            "from_peer": from_peer,
            "forward_hex": body.hex(),
            "refusal": refusal.value,
            "error": error,
        }

    forward_negative = [
        fneg(
            "hop_limit 0",
            Forward(hop_limit=0, path=[o, r], message=unicast).SerializeToString(deterministic=True),
            r,
            RouteRefusal.HOP_LIMIT_EXHAUSTED,
            "hop_limit_exhausted",
        ),
        fneg("loop", wrap_forward(unicast, 5, [o, c, r]), r, RouteRefusal.LOOP, "routing_loop"),
        fneg(
            "altered byte in the origin's message",
            wrap_forward(bytes(altered), 7, [o, r]),
            r,
            RouteRefusal.BAD_SIGNATURE,
            "bad_signature",
        ),
        fneg(
            "path does not end with the neighbour",
            wrap_forward(unicast, 7, [o]),
            r,
            RouteRefusal.BAD_PATH,
            "bad_forward_path",
        ),
        fneg(
            "path does not start with the origin",
            wrap_forward(unicast, 7, [r]),
            r,
            RouteRefusal.BAD_PATH,
            "bad_forward_path",
        ),
        fneg(
            "uppercase AgentId in path",
            Forward(hop_limit=7, path=[o, r.upper()], message=unicast).SerializeToString(deterministic=True),
            r,
            RouteRefusal.BAD_PATH,
            "bad_forward_path",
        ),
        fneg(
            "small-order AgentId in path",
            Forward(hop_limit=7, path=[o, order_8, r], message=unicast).SerializeToString(deterministic=True),
            r,
            RouteRefusal.BAD_PATH,
            "bad_forward_path",
        ),
        fneg(
            "small-order origin",
            Forward(hop_limit=7, path=[order_8, r], message=forged).SerializeToString(deterministic=True),
            r,
            RouteRefusal.BAD_PATH,
            "bad_forward_path",
        ),
        fneg(
            "hop_limit twice",
            bytes.fromhex("0807") + wrap_forward(unicast, 7, [o, r]),
            r,
            RouteRefusal.MALFORMED,
            "field_repeated",
        ),
        fneg(
            "no message",
            Forward(hop_limit=7, path=[o, r]).SerializeToString(deterministic=True),
            r,
            RouteRefusal.MALFORMED,
            "signature_missing",
        ),
    ]
    return {
        "version": MESH_VECTORS_VERSION,
        "description": "IAC mesh payloads: FILE_TRANSFER chunks and acknowledgements, FORWARD wrappers",
        "time_us": _VECTOR_TIME_US,
        "max_skew_us": DEFAULT_MAX_SKEW_US,
        "agents": agents,
        "file_transfer": {
            "content_hex": content.hex(),
            "chunk_size": chunk_size,
            "chunks": chunks,
            "acks": [{"payload": json.loads(a.to_json()), "payload_json": a.to_json()} for a in acks],
            "query": {"payload_json": ft.StateQuery("vector-transfer-1").to_json()},
            "negative": chunk_negative,
        },
        "forward": forward,
        "forward_negative": forward_negative,
    }


def render_mesh_vectors() -> str:
    """``mesh_test_vectors()`` as the exact text of the committed file."""
    return render(mesh_test_vectors())


def write_mesh_vectors(path: str | Path = VECTOR_FILE) -> None:
    """Rewrite the vector file (``python -m tools.vectors.mesh``)."""
    write(path, render_mesh_vectors())


if __name__ == "__main__":
    write_mesh_vectors()
