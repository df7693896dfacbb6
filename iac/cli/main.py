"""The ``iac`` command line: builds the parser from the verb modules and runs one verb.

Each verb prints one clear line on error (:func:`iac.cli.options.print_error`), naming the fix,
and exits non-zero: 2 for arguments the parser refuses (:class:`iac.cli.options.Parser`), 1 for
the verbs' own checks and failures, 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Callable, Sequence

from iac.cli import a2a, bench, conformance, demo, dicts, files, keys, mcp, mesh, net, node, proto, status
from iac.cli.logs import logging_from_args
from iac.cli.options import Parser, print_error
from iac.errors import IacError

Handler = Callable[[argparse.Namespace], int]


def version() -> str:
    """The installed version, from pyproject.toml (as ``iac.__version__``, which the command line,
    a layer below the package's public surface, does not import)."""
    try:
        return importlib.metadata.version("iac-mesh")
    except importlib.metadata.PackageNotFoundError:  # a source checkout that is not installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="iac", description="IAC: signed, compressed peer-to-peer messaging for AI agents.")
    parser.add_argument("--version", action="version", version=f"iac {version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verbs in (keys, dicts, demo, node, status, net, files, mesh, bench, proto, a2a, mcp, conformance):
        verbs.register(sub)
    return parser


def verb_name(args: argparse.Namespace) -> str:
    """The verb as typed: ``ping``, ``certs init``, ``a2a gateway``."""
    action = getattr(args, f"{args.verb}_verb", None)
    return f"{args.verb} {action}" if isinstance(action, str) else str(args.verb)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler = args.func
    if hasattr(args, "verbose"):
        logging_from_args(args)
    try:
        return func(args)
    except IacError as exc:
        print_error(verb_name(args), exc)
        return 1
    except KeyboardInterrupt:
        return 130
