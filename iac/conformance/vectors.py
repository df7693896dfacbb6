"""The negative test vectors a live connection can carry, as bytes from ``v1.json``.

64 negatives exist; the two whose ``max_frame_size`` is 256 need a receiver that announced
256, which a node (at least 1024, section 6) never does, so 62 are live. Each is sent by the
key the vectors are signed with (the ``vectors`` entries' seed, "Alice"), so that a valid
signature would be the HELLO-proved peer's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.errors import CloseCode, ConfigError
from iac.wire._pb.iac_pb2 import Message
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ACK_REQUESTED

#: Where a source checkout keeps the vectors (the tester takes ``--vectors FILE`` otherwise).
DEFAULT_VECTORS = Path(__file__).resolve().parents[2] / "proto" / "testvectors" / "v1.json"

_TABLE = "8 What each fault costs"
#: error name -> (close code, or None for "refused, the connection goes on"; quoted row)
EXPECTED: dict[str, tuple[int | None, str]] = {
    "bad_signature": (
        None,
        "`from` not a valid AgentId, or bad signature, in a MESSAGE frame | refuse, count "
        "`bad_signature` … the connection goes on | ERROR `bad_signature` to the HELLO-proved peer",
    ),
    "invalid_agent_id": (
        None,
        "`from` not a valid AgentId, or bad signature, in a MESSAGE frame | refuse, "
        "count `bad_signature` … the connection goes on | ERROR `bad_signature`",
    ),
    "signature_missing": (
        CloseCode.MALFORMED_MESSAGE,
        "field-8 scan or protobuf parse of a MESSAGE fails | close | `0x08 MALFORMED_MESSAGE`",
    ),
    "frame_too_large": (
        CloseCode.FRAME_TOO_LARGE,
        "frame too large, decompression bomb | close that connection | `0x02 FRAME_TOO_LARGE`",
    ),
    "unknown_frame_type": (
        CloseCode.UNKNOWN_FRAME_TYPE,
        "unknown frame type | close | `0x03 UNKNOWN_FRAME_TYPE`",
    ),
    "unknown_frame_flag": (
        CloseCode.UNKNOWN_FRAME_FLAG,
        "unknown frame flag bit | close | `0x04 UNKNOWN_FRAME_FLAG`",
    ),
    "truncated_frame": (CloseCode.TRUNCATED_FRAME, "truncated frame | close | `0x05 TRUNCATED_FRAME`"),
    "bad_varint": (CloseCode.PROTOCOL_ERROR, "bad varint | close | `0x01 PROTOCOL_ERROR`"),
    "compression_error": (
        CloseCode.BAD_COMPRESSION,
        "zstd body malformed, no content size, content size 0, "
        "trailing data | close | `0x06 BAD_COMPRESSION`",
    ),
    "unknown_dictionary": (
        CloseCode.UNKNOWN_DICTIONARY,
        "zstd body names an unknown dictionary | close | `0x07 UNKNOWN_DICTIONARY`",
    ),
}
for _name in ("signature_repeated", "signature_invalid", "field_repeated", "malformed_message"):
    EXPECTED[_name] = EXPECTED["signature_missing"]
for _name in ("missing_content_size", "zero_content_size", "trailing_data"):
    EXPECTED[_name] = EXPECTED["compression_error"]
EXPECTED["decompression_bomb"] = EXPECTED["frame_too_large"]


@dataclass(frozen=True)
class LiveVector:
    name: str
    error: str
    frame: bytes
    signer: Identity
    close_code: int | None
    quote: str
    section: str = _TABLE
    dictionary: bytes | None = None  # a dictionary of the vectors file the frame names: pushed first
    answered: bool = True  # an accept vector draws an ERROR (stale, not addressed) unless ACK_REQUESTED

    @property
    def truncated(self) -> bool:
        """The stream must end after the bytes for the fault to exist."""
        return self.error == "truncated_frame"


def _zstd_dict_id(frame: bytes) -> int:
    """The dictionary id a compressed MESSAGE frame's zstd header names (0: none, or not parseable)."""
    if len(frame) < 3 or frame[0] != 0x01 or not frame[1] & 0x01:
        return 0
    i = 2
    while i < len(frame) and frame[i] & 0x80:
        i += 1
    z = frame[i + 1 :]
    if len(z) < 6 or z[:4] != b"\x28\xb5\x2f\xfd":
        return 0
    fhd = z[4]
    single = (fhd >> 5) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    start = 5 + (0 if single else 1)
    return int.from_bytes(z[start : start + did_size], "little")


ACCEPT_QUOTE = (
    "`frame_hex`, `max_frame_size`, `agent_id`, `signed_hex`, `unsigned_hex` — frames a receiver MUST accept "
    "though a canonical serializer would not write them"
)


def _load(path: Path | None) -> tuple[Path, dict[str, object]]:
    path = path or DEFAULT_VECTORS
    try:
        doc: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the test vectors {path}: {exc} (give --vectors FILE)") from None
    return path, doc


def _signer_and_files(path: Path, doc: dict[str, Any]) -> tuple[Identity, dict[int, Path]]:
    signer = Identity.from_seed(bytes.fromhex(doc["vectors"][0]["seed_hex"]))
    return signer, {int(k): path.parent / name for k, name in doc.get("dictionaries", {}).items()}


def live_accepts(path: Path | None = None) -> list[LiveVector]:
    """The ``accept`` vectors: frames a receiver must take although no canonical serializer writes
    them. Each is a message from the vectors' signer to another agent: a receiver that accepted the
    frame judges it past its signature (it is not addressed to the receiver, nor fresh)."""
    path, doc = _load(path)
    signer, files = _signer_and_files(path, doc)
    out: list[LiveVector] = []
    for v in doc["accept"]:  # type: ignore[attr-defined]
        frame = bytes.fromhex(v["frame_hex"])
        named = _zstd_dict_id(frame)
        content = files[named].read_bytes() if named in files else None
        ack = bool(Message.FromString(bytes.fromhex(v["signed_hex"])).flags & FLAG_ACK_REQUESTED)
        out.append(
            LiveVector(v["name"], "", frame, signer, None, ACCEPT_QUOTE, "17 Test vectors", content, not ack)
        )
    return out


def live_negatives(path: Path | None = None) -> list[LiveVector]:
    """The negatives of ``v1.json`` a node announcing the default ``max_frame_size`` can be sent."""
    path, doc = _load(path)
    signer, files = _signer_and_files(path, doc)
    out: list[LiveVector] = []
    for v in doc["negative"]:  # type: ignore[attr-defined]
        if int(v.get("max_frame_size", DEFAULT_MAX_FRAME_SIZE)) != DEFAULT_MAX_FRAME_SIZE:
            continue
        if v["error"] not in EXPECTED:
            raise ConfigError(f"negative vector {v['name']}: no expected outcome for error {v['error']!r}")
        code, quote = EXPECTED[v["error"]]
        frame = bytes.fromhex(v["frame_hex"])
        named = _zstd_dict_id(frame)
        content = files[named].read_bytes() if named in files else None
        out.append(LiveVector(v["name"], v["error"], frame, signer, code, quote, dictionary=content))
    return out


__all__ = ["ACCEPT_QUOTE", "DEFAULT_VECTORS", "EXPECTED", "LiveVector", "live_accepts", "live_negatives"]
