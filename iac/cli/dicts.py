"""``iac dict train``: train a zstd dictionary on sample files.

``.jsonl`` files give one sample per line, any other file one sample. Prints the dictionary's
id, size and SHA-256. It refuses to replace ``--out`` unless ``--force`` (as ``iac keygen`` does).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iac.cli.checks import output_file
from iac.cli.options import integer
from iac.errors import ConfigError
from iac.wire.dicts import MAX_DICT_SIZE, train

#: The smallest dictionary zstd trains.
MIN_DICT_SIZE = 256
#: zstd's compression levels.
MIN_LEVEL, MAX_LEVEL = 1, 22


def read_samples(paths: Sequence[str]) -> list[bytes]:
    """Samples from files: a ``.jsonl`` file gives one sample per line, any other file one sample."""
    samples: list[bytes] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise ConfigError(f"{p}: is a directory; give the sample files in it (e.g. {path / '*.jsonl'})")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{p}: no such sample file; check the path") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read it ({exc.strerror}); check its permissions") from None
        if p.endswith(".jsonl"):
            samples.extend(line for line in data.splitlines() if line.strip())
        else:
            samples.append(data)
    return samples


def _cmd_dict_train(args: argparse.Namespace) -> int:
    out = output_file("--out", args.out, force=args.force, example="team.zdict")
    samples = read_samples(args.samples)
    try:
        d = train(samples, args.size, dict_id=args.dict_id, level=args.level)
    except ConfigError as exc:
        if "at least 8" in str(exc):
            raise
        raise ConfigError(
            f"zstd could not train a {args.size}-byte dictionary on these {len(samples)} samples; "
            "give more (or larger) samples, or a smaller --size"
        ) from None
    try:
        out.write_bytes(d.content)
    except OSError as exc:
        raise ConfigError(
            f"--out {args.out}: cannot write it ({exc.strerror}); choose a writable path"
        ) from None
    print(f"dict_id={d.dict_id} size={len(d.content)} sha256={d.sha256.hex()} -> {out}")
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``dict train`` to the ``iac`` parser."""
    p = sub.add_parser("dict", help="compression dictionaries")
    dsub = p.add_subparsers(dest="dict_verb", metavar="ACTION", required=True)
    t = dsub.add_parser("train", help="train a zstd dictionary on sample files (.jsonl: one per line)")
    t.add_argument("samples", nargs="+", help="sample files")
    t.add_argument("--out", required=True, help="dictionary file to write")
    t.add_argument("--force", action="store_true", help="replace --out if it exists")
    t.add_argument(
        "--size",
        type=integer(minimum=MIN_DICT_SIZE, maximum=MAX_DICT_SIZE, what="size in bytes"),
        default=16384,
        help=f"dictionary size in bytes, {MIN_DICT_SIZE} to {MAX_DICT_SIZE} (default %(default)s)",
    )
    t.add_argument(
        "--level",
        type=integer(minimum=MIN_LEVEL, maximum=MAX_LEVEL, what="zstd level"),
        default=3,
        help=f"zstd level the dictionary is tuned for, {MIN_LEVEL} to {MAX_LEVEL} (default %(default)s)",
    )
    t.add_argument(
        "--dict-id",
        type=integer(minimum=1, maximum=2**32 - 1, what="dictionary id"),
        default=None,
        help="dictionary id, 1 to 4294967295 (default: random)",
    )
    t.set_defaults(func=_cmd_dict_train)


__all__ = ["read_samples", "register"]
