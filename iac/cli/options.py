"""What the verbs of the ``iac`` command share: the ``--listen`` and CA options, the transport
config they make, serving until a signal, JSON arguments and the one error line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import sys
from collections.abc import Iterable
from typing import Any

from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.transport.base import TransportConfig


def node_default(name: str) -> Any:
    """The default of the :class:`~iac.NodeConfig` field ``name``, for help texts that show a
    default the node applies (an option left unset passes None and the node picks it)."""
    for f in dataclasses.fields(NodeConfig):
        if f.name == name:
            return f.default
    raise KeyError(name)


def add_listen_option(p: argparse.ArgumentParser) -> None:
    """``--listen URL`` (required, repeatable)."""
    p.add_argument(
        "--listen",
        action="append",
        required=True,
        metavar="URL",
        help="quic://host:port, tls://host:port or unix:///path (repeatable; port 0 picks one)",
    )


def add_registry_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--registry ID@URL`` (repeatable): a registry node, by AgentId and address."""
    p.add_argument("--registry", action="append", default=[], metavar="ID@URL", help=help)


def add_tls_options(p: argparse.ArgumentParser) -> None:
    """``--ca``, ``--cert`` and ``--cert-key``: CA mode (see :func:`transport_config`)."""
    p.add_argument("--ca", default=None, help="CA mode: CA certificate (PEM) that peers must chain to")
    p.add_argument("--cert", default=None, help="CA mode: this node's certificate (PEM)")
    p.add_argument("--cert-key", default=None, help="CA mode: this node's certificate key (PEM)")


def transport_config(args: argparse.Namespace, **extra: Any) -> TransportConfig:
    """The transport config of the CA options (``--ca`` needs ``--cert`` and ``--cert-key``),
    with ``extra`` settings."""
    if args.ca and not (args.cert and args.cert_key):
        raise ConfigError("--ca needs --cert and --cert-key (make them with `iac certs init`)")
    return TransportConfig(ca_file=args.ca, cert_file=args.cert, key_file=args.cert_key, **extra)


def print_listening(addresses: Iterable[str]) -> None:
    """One ``listening URL`` line per address (flushed: a script waits for them)."""
    for addr in addresses:
        print(f"listening {addr}", flush=True)


async def serve_until_signal() -> None:
    """Wait until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def json_arg(text: str, what: str) -> Any:
    """A command-line argument parsed as JSON; :class:`ConfigError` naming ``what`` otherwise."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not JSON: {exc}") from None


def print_error(verb: str, exc: BaseException) -> None:
    """The one line on stderr for a verb that failed: ``iac VERB: error: TEXT``."""
    print(f"iac {verb}: error: {exc}", file=sys.stderr)


__all__ = [
    "add_listen_option",
    "add_registry_option",
    "add_tls_options",
    "json_arg",
    "node_default",
    "print_error",
    "print_listening",
    "serve_until_signal",
    "transport_config",
]
