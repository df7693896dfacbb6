"""Write the shipped dictionary and proto/testvectors/dictionaries-v1.json.

    .venv/bin/python -m tools.vectors.dictionaries

* ``dict-39616.zdict``: a byte-for-byte copy of the dictionary the package ships
  (``iac/data/default.dict``), which every ``iac`` verb and a default ``Node`` announce in
  HELLO ``dict_ids``; the JSON file gives its id, size and SHA-256.
* ``derived``: a pushed dictionary (docs/PROTOCOL.md, "Pushed dictionaries") derived from
  that base for two fixed AgentIds: the appended tail, the bytes whose SHA-256 gives the id,
  the id, the ``sha256`` of the content, the DICT frame and its DICT_ACK. Peers that both
  announce ``elide/1`` push nothing; the vector is the rule for a peer that does not.

Everything is fixed except the zstd-compressed DICT frame, whose bytes depend on the zstd
version: an existing ``dict_frame_hex`` in the file is kept while it still decodes to the same
``Dict``, so regenerating with another zstd changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from iac.errors import IacError
from iac.wire._pb.iac_pb2 import Dict
from iac.wire.dicts import (
    ZSTD_DICT_MAGIC,
    DictionarySet,
    default_dictionary,
    derive_dictionary,
    message_prefix,
)
from iac.wire.frames import FrameType, decode_frame, encode_frame
from iac.wire.identity import Identity
from tools.vectors import render, write

ROOT = Path(__file__).resolve().parent.parent.parent
OUT_DIR = ROOT / "proto" / "testvectors"
VECTOR_FILE = OUT_DIR / "dictionaries-v1.json"
VECTORS_VERSION = 1


def shipped_file_name(dict_id: int) -> str:
    return f"dict-{dict_id}.zdict"


def _identity(n: int) -> Identity:
    return Identity.from_seed(bytes((n * 0x11 + i) & 0xFF for i in range(32)))


def dictionary_vectors(previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The vector document; ``previous``: the file as it is, whose zstd frame is kept if valid."""
    base = default_dictionary()
    pusher, peer = _identity(1), _identity(2)
    # What the pusher appends: a Message from the peer to it, then one from it to the peer.
    tail = message_prefix(peer.agent_id, pusher.agent_id) + message_prefix(pusher.agent_id, peer.agent_id)
    derived = derive_dictionary(base, tail)
    hashed = ZSTD_DICT_MAGIC + bytes(4) + derived.content[8:]
    body = Dict(dict_id=derived.dict_id, sha256=derived.sha256, content=derived.content).SerializeToString()
    fresh = encode_frame(FrameType.DICT, body, compress_with=base)
    frame_hex = fresh.hex()
    old = ((previous or {}).get("derived") or {}).get("dict_frame_hex")
    if old:
        try:
            f = decode_frame(bytes.fromhex(old), dictionaries=DictionarySet([base]))
            if f.type == FrameType.DICT and f.body == body and f.dict_id == base.dict_id:
                frame_hex = old
        except (IacError, ValueError):
            pass
    ack = Dict(dict_id=derived.dict_id, sha256=derived.sha256).SerializeToString()
    return {
        "version": VECTORS_VERSION,
        "description": "IAC dictionaries: the shipped one, and a pushed dictionary derived from it",
        "shipped": {
            "dict_id": base.dict_id,
            "file": shipped_file_name(base.dict_id),
            "size": len(base.content),
            "sha256": hashlib.sha256(base.content).hexdigest(),
        },
        "derived": {
            "note": "pushed by `pusher` to `peer` after the handshake when the two do not both announce "
            "elide/1; base: the shipped dictionary (the first of the peer's dict_ids the pusher has)",
            "base": shipped_file_name(base.dict_id),
            "pusher_seed_hex": pusher.seed().hex(),
            "pusher": pusher.agent_id,
            "peer_seed_hex": peer.seed().hex(),
            "peer": peer.agent_id,
            "tail_hex": tail.hex(),
            "id_source_sha256": hashlib.sha256(hashed).hexdigest(),
            "dict_id": derived.dict_id,
            "content_size": len(derived.content),
            "sha256": derived.sha256.hex(),
            "dict_body_sha256": hashlib.sha256(body).hexdigest(),
            "dict_frame_hex": frame_hex,
            "dict_ack_frame_hex": encode_frame(FrameType.DICT_ACK, ack).hex(),
        },
    }


def render_dictionary_vectors(previous_text: str | None = None) -> str:
    """The exact text of the JSON file (keeping ``previous_text``'s zstd frame if it still decodes)."""
    previous = json.loads(previous_text) if previous_text else None
    return render(dictionary_vectors(previous))


def write_dictionary_vectors(out_dir: Path = OUT_DIR) -> None:
    """Rewrite the shipped copy and the JSON file (``python -m tools.vectors.dictionaries``)."""
    base = default_dictionary()
    (out_dir / shipped_file_name(base.dict_id)).write_bytes(base.content)
    path = out_dir / VECTOR_FILE.name
    previous = path.read_text(encoding="utf-8") if path.exists() else None
    write(path, render_dictionary_vectors(previous))


if __name__ == "__main__":
    write_dictionary_vectors()
