"""Key verbs of the ``iac`` command: ``keygen`` and ``id``.

``iac keygen --out FILE [--force]`` writes a new agent key (mode 0600) and prints its AgentId; it
refuses to replace a file unless ``--force``. ``iac id --key FILE`` prints the AgentId of a key file.
"""

from __future__ import annotations

import argparse
from typing import Any

from iac.cli.checks import load_key, output_file
from iac.wire.identity import Identity


def _cmd_keygen(args: argparse.Namespace) -> int:
    out = output_file("--out", args.out, force=args.force, example="agent.key", lost=" (its key is lost)")
    ident = Identity.generate()
    ident.save(out, overwrite=args.force)
    print(ident.agent_id)
    return 0


def _cmd_id(args: argparse.Namespace) -> int:
    print(load_key(args.key).agent_id)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``keygen`` and ``id`` to the ``iac`` parser."""
    p = sub.add_parser("keygen", help="create an agent key file (mode 0600) and print its AgentId")
    p.add_argument("--out", required=True, help="key file to write")
    p.add_argument("--force", action="store_true", help="replace an existing file (its key is lost)")
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser("id", help="print the AgentId of a key file")
    p.add_argument("--key", required=True, help="key file")
    p.set_defaults(func=_cmd_id)


__all__ = ["register"]
