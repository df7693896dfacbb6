"""The ``iac`` command line. Each verb prints one clear line on error and exits non-zero."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from iac import __version__
from iac.errors import IacError

Handler = Callable[[argparse.Namespace], int]


def _cmd_keygen(args: argparse.Namespace) -> int:
    from iac.wire.identity import Identity

    ident = Identity.generate()
    ident.save(args.out, overwrite=args.force)
    print(ident.agent_id)
    return 0


def _cmd_id(args: argparse.Namespace) -> int:
    from iac.wire.identity import Identity

    print(Identity.load(args.key).agent_id)
    return 0


def _read_samples(paths: Sequence[str]) -> list[bytes]:
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
    from iac.wire.dicts import train

    d = train(_read_samples(args.samples), args.size, dict_id=args.dict_id, level=args.level)
    out = Path(args.out)
    out.write_bytes(d.content)
    print(f"dict_id={d.dict_id} size={len(d.content)} sha256={d.sha256.hex()} -> {out}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from iac.demo.driver import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iac", description="IAC: signed, compressed peer-to-peer messaging for AI agents."
    )
    parser.add_argument("--version", action="version", version=f"iac {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = sub.add_parser("keygen", help="create an agent key file (mode 0600) and print its AgentId")
    p.add_argument("--out", required=True, help="key file to write")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser("id", help="print the AgentId of a key file")
    p.add_argument("--key", required=True, help="key file")
    p.set_defaults(func=_cmd_id)

    p = sub.add_parser("dict", help="compression dictionaries")
    dsub = p.add_subparsers(dest="dict_verb", metavar="ACTION", required=True)
    t = dsub.add_parser("train", help="train a zstd dictionary on sample files (.jsonl: one per line)")
    t.add_argument("samples", nargs="+", help="sample files")
    t.add_argument("--out", required=True, help="dictionary file to write")
    t.add_argument("--size", type=int, default=16384, help="dictionary size in bytes (default 16384)")
    t.add_argument("--level", type=int, default=3, help="zstd level the dictionary is tuned for")
    t.add_argument("--dict-id", type=int, default=None, help="dictionary id (default: random)")
    t.set_defaults(func=_cmd_dict_train)

    p = sub.add_parser("demo", help="run the demo on loopback: a 5-process agent mesh")
    p.add_argument(
        "--codec", action="store_true", help="the codec demo instead (one process, corpus payloads)"
    )
    p.add_argument("--count", type=int, default=None, help="payloads for --codec (default 500)")
    p.set_defaults(func=_cmd_demo)

    from iac.cli.net import register as register_net

    register_net(sub)

    from iac.cli.files import register as register_files

    register_files(sub)

    from iac.cli.mesh import register as register_mesh

    register_mesh(sub)

    from iac.cli.bench import register as register_bench

    register_bench(sub)

    from iac.cli.proto import register as register_proto

    register_proto(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler = args.func
    try:
        return func(args)
    except IacError as exc:
        print(f"iac {args.verb}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
