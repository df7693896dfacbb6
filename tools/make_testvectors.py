"""Write proto/testvectors/v1.json: the byte-level contract with other implementations.

    .venv/bin/python -m tools.make_testvectors [--out DIR] [--check]

Everything comes from fixed seeds and fixed message fields, so the output is
deterministic. Two things depend on the zstd library version and are kept
stable on purpose:

* the vector dictionary (``dict-<id>.zdict`` beside ``v1.json``): trained once
  on a fixed sample set and then reused from the output folder (or from the
  committed copy) rather than retrained;
* ``frame_zstd_hex`` and the other zstd-compressed frames: an existing value in
  the output folder's ``v1.json`` is kept when it still decodes to the same
  bytes, so regenerating with another zstd version changes nothing.

Every other negative zstd frame is built by hand (raw and RLE blocks), so it
does not depend on any compressor. ``--check`` regenerates into memory and
exits 1 if the files on disk differ. The vectors are built in tools/vectors/wire/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import iac
from iac.wire import DictionarySet, FrameType
from iac.wire.scan import excise_signature
from tools.vectors import render
from tools.vectors.wire.common import (
    DEFAULT_OUT,
    DICT_FILE,
    DICT_ID,
    VECTOR_FILE,
    decodes_to,
    dict_frame,
    frame,
    keep_if_same,
    load_or_train_dictionary,
    message_json,
)
from tools.vectors.wire.negative import negative_vectors
from tools.vectors.wire.positive import accept_vectors, hello_vectors, positive_messages

# --- the whole file -------------------------------------------------------------------------


def build(out_dir: Path, previous: dict[str, Any] | None) -> dict[str, Any]:
    d = load_or_train_dictionary(out_dir)
    dicts = DictionarySet([d])
    prev_zstd: dict[str, str] = {}
    if previous:
        for v in previous.get("vectors", []):
            prev_zstd["vector:" + v["name"]] = v.get("frame_zstd_hex", "")
        for v in previous.get("accept", []):
            prev_zstd["accept:" + v["name"]] = v.get("frame_hex", "")

    vectors: list[dict[str, Any]] = []
    signed_of: dict[str, bytes] = {}
    for name, description, ident, msg in positive_messages():
        unsigned = iac.wire.unsigned_bytes(msg)
        signed = iac.wire.sign_message(ident, msg)
        signature = bytes(msg.signature)
        assert excise_signature(signed) == (unsigned, signature)
        iac.wire.open_message(signed)
        signed_of[name] = signed
        zstd_hex = keep_if_same(
            prev_zstd.get("vector:" + name), decodes_to(dicts, signed), dict_frame(d, signed)
        )
        vectors.append(
            {
                "name": name,
                "description": description,
                "seed_hex": ident.seed().hex(),
                "agent_id": ident.agent_id,
                "message": message_json(msg),
                "unsigned_hex": unsigned.hex(),
                "signature_hex": signature.hex(),
                "signed_hex": signed.hex(),
                "frame_raw_hex": frame(FrameType.MESSAGE, 0, signed).hex(),
                "frame_zstd_hex": zstd_hex,
                "dict_id": DICT_ID,
            }
        )

    accept = accept_vectors(d, dicts, signed_of, prev_zstd)
    hello, hello_negative = hello_vectors()
    negative = negative_vectors(d, signed_of)
    return {
        "version": 1,
        "dictionaries": {str(DICT_ID): DICT_FILE},
        "vectors": vectors,
        "accept": accept,
        "hello": hello,
        "hello_negative": hello_negative,
        "negative": negative,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default proto/testvectors)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the files on disk are not up to date")
    args = ap.parse_args(argv)
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / VECTOR_FILE
    previous = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    text = render(build(out_dir, previous))
    if args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path}: out of date; run tools/make_testvectors.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    doc = json.loads(text)
    print(
        f"{path}: {len(doc['vectors'])} vectors, {len(doc['accept'])} accept, {len(doc['hello'])} hello, "
        f"{len(doc['negative'])} negative; dictionary {DICT_FILE}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
