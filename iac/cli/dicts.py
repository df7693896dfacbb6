"""``iac dict train``: train a zstd dictionary on sample files.

``.jsonl`` files give one sample per line, any other file one sample. Prints the dictionary's
id, size and SHA-256.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iac.errors import IacError
from iac.wire.dicts import train


def read_samples(paths: Sequence[str]) -> list[bytes]:
    """Samples from files: a ``.jsonl`` file gives one sample per line, any other file one sample."""
    samples: list[bytes] = []
    for p in paths:
        try:
            data = Path(p).read_bytes()
        except OSError as exc:
            raise IacError(f"{p}: {exc.strerror}") from None
        if p.endswith(".jsonl"):
            samples.extend(line for line in data.splitlines() if line.strip())
        else:
            samples.append(data)
    return samples


def _cmd_dict_train(args: argparse.Namespace) -> int:
    d = train(read_samples(args.samples), args.size, dict_id=args.dict_id, level=args.level)
    out = Path(args.out)
    out.write_bytes(d.content)
    print(f"dict_id={d.dict_id} size={len(d.content)} sha256={d.sha256.hex()} -> {out}")
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``dict train`` to the ``iac`` parser."""
    p = sub.add_parser("dict", help="compression dictionaries")
    dsub = p.add_subparsers(dest="dict_verb", metavar="ACTION", required=True)
    t = dsub.add_parser("train", help="train a zstd dictionary on sample files (.jsonl: one per line)")
    t.add_argument("samples", nargs="+", help="sample files")
    t.add_argument("--out", required=True, help="dictionary file to write")
    t.add_argument("--size", type=int, default=16384, help="dictionary size in bytes (default %(default)s)")
    t.add_argument("--level", type=int, default=3, help="zstd level the dictionary is tuned for")
    t.add_argument("--dict-id", type=int, default=None, help="dictionary id (default: random)")
    t.set_defaults(func=_cmd_dict_train)


__all__ = ["read_samples", "register"]
