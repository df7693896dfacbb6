"""File verbs of the ``iac`` command: ``send-file``, and the inbox options of ``iac node``.

``iac send-file --key K --to AGENT_ID --addr URL [--addr URL ...] PATH [--name N]``
sends a file to a node's inbox with :meth:`iac.Node.send_file` and prints one
line when the receiver verified it (wrapped here)::

    sent report.pdf 20971520 bytes sha256=… to 3f1c…  in 0.41 s (51.2 MB/s), 80 chunks sent,
    0 resent, 0 resumed, 0 reconnects

``chunks sent`` counts the chunks this run sent (``resent`` of them again, after a loss);
``resumed`` the chunks the receiver already held from an earlier run that was stopped (the
same file to the same node continues where it stopped); ``reconnects`` the broken connections
it recovered from. The rate is over what this run sent.

A progress bar goes to stderr while it runs (not when stderr is not a terminal,
nor with ``--quiet``). ``--via RELAY_ID`` sends through a relay instead; ``--addr``
then names the relay's addresses.

``iac node --inbox DIR`` (:mod:`iac.cli.node`) takes files into ``DIR`` and prints
``received NAME SIZE sha256=… from ID`` for each (:func:`print_received`).

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``). Ctrl-C stops it with
one line saying how far it got and that running the same command again resumes (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from iac.cli import checks
from iac.cli.options import (
    add_transport_options,
    integer,
    node_default,
    seconds,
    transport_config,
)
from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.node.types import ReceivedFile
from iac.protocol.files import MAX_WINDOW, TransferProgress

_BAR = 30


class ProgressBar:
    """A one-line text progress bar (``[#####-----]  48%  12.0/24.0 MiB  35.2 MB/s``)."""

    def __init__(self, stream: TextIO, name: str, *, enabled: bool) -> None:
        self.stream = stream
        self.name = name
        self.enabled = enabled
        self.start = time.monotonic()
        self.shown = -1.0
        self._drawn = False

    def update(self, done: int, size: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        frac = 1.0 if size == 0 else done / size
        now = time.monotonic()
        if not force and now - self.shown < 0.1 and frac < 1.0:
            return
        self.shown = now
        filled = int(frac * _BAR)
        rate = done / max(now - self.start, 1e-6) / 1e6
        self.stream.write(
            f"\r{self.name[:24]:<24} [{'#' * filled}{'-' * (_BAR - filled)}] {frac * 100:5.1f}%  "
            f"{done / 2**20:.1f}/{size / 2**20:.1f} MiB  {rate:.1f} MB/s "
        )
        self.stream.flush()
        self._drawn = True

    def finish(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


async def _run_send_file(args: argparse.Namespace, progress: list[TransferProgress] | None = None) -> int:
    identity = checks.load_key(args.key)
    for flag, value in (("--to", args.to), ("--via", args.via)):
        if value is not None:
            checks.agent_id(flag, value)
    for url in args.addr:
        checks.address("--addr", url)
    path = Path(args.path)
    if path.is_dir():
        raise ConfigError(
            f"{path}: is a directory; send-file sends one file (pack a directory with tar first)"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; give the path of the file to send")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{path}: not readable by this user; check its permissions")
    name = args.name if args.name is not None else path.name
    bar = ProgressBar(sys.stderr, name, enabled=not args.quiet and sys.stderr.isatty())

    def on_progress(p: TransferProgress) -> None:
        bar.update(p.bytes_done, p.size)
        if progress is not None:
            progress[:] = [p]

    config = NodeConfig(transport=transport_config(args))
    async with Node(identity, config=config) as node:
        node.add_peer(args.via or args.to, *args.addr)
        try:
            res = await node.send_file(
                args.to,
                path,
                name=args.name,
                on_progress=on_progress,
                timeout=args.timeout,
                via=args.via,
                window=args.window,
            )
        finally:
            bar.finish()
    first_sends = res.chunks - res.chunks_resumed  # distinct chunks this run sent
    carried = res.size * first_sends / max(res.chunks, 1)
    rate = carried / max(res.seconds, 1e-9) / 1e6
    print(
        f"sent {res.name} {res.size} bytes sha256={res.sha256} to {res.peer[:16]}… in {res.seconds:.2f} s "
        f"({rate:.1f} MB/s), {res.chunks_sent} chunks sent, {res.chunks_resent} resent, "
        f"{res.chunks_resumed} resumed, {res.resumed} reconnects"
    )
    return 0


def _cmd_send_file(args: argparse.Namespace) -> int:
    progress: list[TransferProgress] = []
    try:
        return asyncio.run(_run_send_file(args, progress))
    except KeyboardInterrupt:
        print(interrupted_line(progress[0] if progress else None), file=sys.stderr, flush=True)
        return 130


def interrupted_line(p: TransferProgress | None) -> str:
    """The one line ``iac send-file`` prints when Ctrl-C stops it: how far it got, and that the
    same command resumes (the receiver keeps the chunks it verified, for a day:
    ``NodeConfig.file_partial_ttl``)."""
    done = f" at {p.fraction:.0%} ({p.bytes_done} of {p.size} bytes acknowledged)" if p is not None else ""
    return (
        f"iac send-file: interrupted{done}; run the same command again to resume: "
        "the receiver keeps the chunks it verified"
    )


def inbox_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~iac.NodeConfig` settings of ``iac node --inbox DIR [--max-file-size N]``
    (``NodeConfig(..., **inbox_options(args))``; empty without ``--inbox``)."""
    inbox = getattr(args, "inbox", None)
    max_size = getattr(args, "max_file_size", None)
    if inbox is None:
        if max_size is not None:
            raise ConfigError("--max-file-size bounds the files of an inbox: it needs --inbox DIR")
        return {}
    checks.output_dir("--inbox", inbox)
    out: dict[str, Any] = {"inbox_dir": inbox}
    if max_size is not None:
        out["max_file_size"] = max_size
    return out


def print_received(f: ReceivedFile) -> None:
    """The line ``iac node --inbox`` prints for each file it took: ``received NAME SIZE sha256=… from ID``."""
    print(f"received {f.name} {f.size} sha256={f.sha256} from {f.sender}", flush=True)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``send-file`` to the ``iac`` parser."""
    p = sub.add_parser("send-file", help="send a file to a node's inbox (with a progress bar)")
    p.add_argument("path", metavar="PATH", help="the file to send")
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="AGENT_ID", help="the receiving node's AgentId")
    p.add_argument(
        "--addr",
        action="append",
        required=True,
        metavar="URL",
        help="the node's address (repeatable); with --via, the relay's address",
    )
    p.add_argument("--via", default=None, metavar="AGENT_ID", help="send through this relay")
    p.add_argument("--name", default=None, help="file name in the receiver's inbox (default: PATH's name)")
    p.add_argument(
        "--timeout",
        type=seconds(example="30"),
        default=30.0,
        help="give up after this many seconds without progress (default %(default)g)",
    )
    p.add_argument(
        "--window",
        type=integer(minimum=1, maximum=MAX_WINDOW, what="number of chunks"),
        default=None,
        help=f"chunks in flight (default {node_default('file_window')})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_transport_options(p)
    p.set_defaults(func=_cmd_send_file)


__all__ = ["ProgressBar", "inbox_options", "print_received", "register"]
