"""``iac demo``: the 5-process agent mesh on loopback, or with ``--codec`` the codec demo
(:mod:`iac.demo`)."""

from __future__ import annotations

import argparse
from typing import Any

from iac.demo.codec import DEFAULT_COUNT
from iac.demo.driver import run_demo


def _cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(args)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``demo`` to the ``iac`` parser."""
    p = sub.add_parser("demo", help="run the demo on loopback: a 5-process agent mesh")
    p.add_argument(
        "--codec", action="store_true", help="the codec demo instead (one process, corpus payloads)"
    )
    p.add_argument("--count", type=int, default=None, help=f"payloads for --codec (default {DEFAULT_COUNT})")
    p.set_defaults(func=_cmd_demo)


__all__ = ["register"]
