#!/usr/bin/env python3
"""Train the dictionary shipped with IAC (``iac/data/default.dict``).

    python tools/train_default_dict.py            # what ``make dict`` runs
    python tools/train_default_dict.py --check    # retrain in memory, compare with the committed file

Trained on ``iac/bench/corpus/train.jsonl`` (one ``payload_json`` per line), never on
``test.jsonl``, which is kept for measuring. The parameters below were picked by a sweep
over dictionary size (16 KiB .. 256 KiB), zstd level (1 .. 19) and the fastCover
parameters ``k``/``d`` (see benchmarks/README.md). With ``k`` and ``d`` fixed, no
``steps`` and one thread, zstd's trainer is deterministic: the same zstd version gives
the same bytes. Still, the committed file is the reference (other zstd versions may
train a slightly different dictionary), and ``--check`` tells whether they agree.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "iac" / "bench" / "corpus" / "train.jsonl"
OUT = ROOT / "iac" / "data" / "default.dict"

#: Fixed id of the shipped dictionary: 0x8000 + 0x1AC0, inside IAC's range 32768..65535
#: (two bytes in every zstd frame header that uses it).
DICT_ID = 0x9AC0
#: 64 KiB: 16 KiB saves 63.6 %, 64 KiB 64.2 %, 256 KiB 64.7 % on test.jsonl at level 3.
DICT_SIZE = 64 * 1024
#: The level the entropy tables are tuned for and the level senders compress at. Level 3
#: is iac.wire.dicts.DEFAULT_LEVEL; higher levels gain ~1-2 points for 2-25x the CPU.
LEVEL = 3
#: fastCover segment size and dmer size (found by zstd's optimizer, steps=64, then fixed).
K = 482
D = 6


def read_samples(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def train_default(samples: list[bytes]) -> bytes:
    items: list[bytes | bytearray | memoryview] = list(samples)
    zd = zstandard.train_dictionary(DICT_SIZE, items, k=K, d=D, dict_id=DICT_ID, level=LEVEL)
    return zd.as_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=TRAIN, help="training samples, .jsonl")
    parser.add_argument("--out", type=Path, default=OUT, help="dictionary file to write")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)

    samples = read_samples(args.train)
    content = train_default(samples)
    digest = hashlib.sha256(content).hexdigest()
    params = f"level={LEVEL} k={K} d={D} zstd={'.'.join(map(str, zstandard.ZSTD_VERSION))}"
    if args.check:
        same = args.out.exists() and args.out.read_bytes() == content
        print(
            f"dict_id={DICT_ID} sha256={digest} {params}: {'matches' if same else 'DIFFERS from'} {args.out}"
        )
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(content)
    print(
        f"dict_id={DICT_ID} size={len(content)} sha256={digest} {params} samples={len(samples)} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
