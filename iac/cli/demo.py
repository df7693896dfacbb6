"""``iac demo``: the 5-process agent mesh on loopback, or with ``--codec`` the codec demo
(:mod:`iac.demo`)."""

from __future__ import annotations

import argparse
from typing import Any

from iac.cli.options import integer
from iac.demo.codec import DEFAULT_COUNT
from iac.demo.driver import run_demo
from iac.errors import ConfigError


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.count is not None and not args.codec:
        raise ConfigError("--count sets the payloads of the codec demo: add --codec")
    return run_demo(args)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``demo`` to the ``iac`` parser."""
    p = sub.add_parser("demo", help="run the demo on loopback: a 5-process agent mesh")
    p.add_argument(
        "--codec", action="store_true", help="the codec demo instead (one process, corpus payloads)"
    )
    p.add_argument(
        "--count",
        type=integer(minimum=1, maximum=1_000_000, what="number of payloads"),
        default=None,
        help=f"payloads for --codec (default {DEFAULT_COUNT})",
    )
    p.set_defaults(func=_cmd_demo)


__all__ = ["register"]
