"""What the verbs of the ``iac`` command share: the parser whose errors are one line, the checked
argument types (seconds, counts, sizes), the ``--listen``, transport and CA options, the options
of a node that runs until interrupted (logging, status socket, metrics), the transport config
they make, serving until a signal, JSON arguments and the one error line.

Every bad argument ends a verb with one line on stderr that names the fix, and a non-zero exit:
argparse's errors (exit 2) through :class:`Parser`, the verbs' own checks (exit 1) as
:class:`~iac.errors.ConfigError` printed by :func:`print_error`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from iac.cli.logs import add_logging_options
from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.transport.base import CONGESTION_CONTROLS, DEFAULT_CONGESTION, TransportConfig
from iac.wire.dicts import DictionarySet, default_dictionary
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE

#: The longest wait a ``--timeout`` may ask for (a week).
MAX_TIMEOUT = 7 * 86400.0
#: The longest lifetime a ``--ttl``, ``--max-ttl`` or ``--grace`` may ask for (a year).
MAX_LIFETIME = 365 * 86400.0


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``iac VERB: error: TEXT; see `iac VERB --help```."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


# --- checked argument types ---------------------------------------------------------------------


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


_SPANS = {86400.0: "a day", MAX_TIMEOUT: "a week", MAX_LIFETIME: "a year"}


def seconds(
    *, maximum: float = MAX_TIMEOUT, zero: bool = False, example: str = "10"
) -> Callable[[str], float]:
    """An argument type: a finite number of seconds, more than 0 (or 0 too, with ``zero``) and at
    most ``maximum``; the error names the range and an example."""
    low = "0 or more" if zero else "more than 0"
    most = f"{maximum:.0f}" if maximum == int(maximum) else f"{maximum:g}"
    if maximum in _SPANS:
        most += f" ({_SPANS[maximum]})"

    def parse(text: str) -> float:
        try:
            value = _number(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(
                f"{exc} of seconds: give a finite number {low} and at most {most}, e.g. {example}"
            ) from None
        if value < 0 or (value == 0 and not zero) or value > maximum:
            raise argparse.ArgumentTypeError(
                f"{text} seconds is out of range: give a number {low} and at most {most}, e.g. {example}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


def integer(*, minimum: int = 1, maximum: int | None = None, what: str = "number") -> Callable[[str], int]:
    """An argument type: a whole number in ``minimum..maximum``; the error names the range."""
    span = f"from {minimum} to {maximum}" if maximum is not None else f"of {minimum} or more"

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number: give a {what} {span}"
            ) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a {what} {span}")
        return value

    parse.__name__ = "integer"
    return parse


def node_default(name: str) -> Any:
    """The default of the :class:`~iac.NodeConfig` field ``name``, for help texts that show a
    default the node applies (an option left unset passes None and the node picks it)."""
    for f in dataclasses.fields(NodeConfig):
        if f.name == name:
            return f.default
    raise KeyError(name)


# --- shared options -------------------------------------------------------------------------------


def add_listen_option(p: argparse.ArgumentParser) -> None:
    """``--listen URL`` (required, repeatable)."""
    p.add_argument(
        "--listen",
        action="append",
        required=True,
        metavar="URL",
        help="quic://host:port, tls://host:port or unix:///dir/name.sock (repeatable; port 0 picks "
        "one; a UNIX socket's directory must be private, mode 0700, and is made so when missing)",
    )


def add_registry_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--registry ID@URL`` (repeatable): a registry node, by AgentId and address."""
    p.add_argument("--registry", action="append", default=[], metavar="ID@URL", help=help)


def add_transport_options(p: argparse.ArgumentParser) -> None:
    """``--ca``, ``--cert`` and ``--cert-key`` (CA mode), ``--qlog DIR``, ``--congestion`` and
    ``--max-datagram-size``, ``--no-quic-ack-frequency`` (see :func:`transport_config`)."""
    p.add_argument("--ca", default=None, help="CA mode: CA certificate (PEM) that peers must chain to")
    p.add_argument("--cert", default=None, help="CA mode: this node's certificate (PEM)")
    p.add_argument("--cert-key", default=None, help="CA mode: this node's certificate key (PEM)")
    p.add_argument(
        "--qlog",
        default=None,
        metavar="DIR",
        help="write a qlog file per QUIC connection into DIR (for qvis; created if missing)",
    )
    p.add_argument(
        "--congestion",
        choices=CONGESTION_CONTROLS,
        default=None,
        help=f"QUIC congestion control (default {DEFAULT_CONGESTION}; bbr: paced, model-based, "
        "for lossy or deep-buffered links)",
    )
    p.add_argument(
        "--max-datagram-size",
        type=int,
        default=None,
        metavar="BYTES",
        help=f"QUIC path MTU discovery probes up to this UDP payload (default "
        f"{TransportConfig.quic_max_datagram_size}; a 1,500-byte IPv4 path settles at 1,472; 1200..65527; "
        "0: no probing, every packet 1,200 bytes)",
    )
    p.add_argument(
        "--no-quic-ack-frequency",
        action="store_true",
        help="QUIC: neither offer nor honour the ACK Frequency extension (a receiver then "
        "acknowledges every second packet or after 1 ms, as RFC 9000 lets it)",
    )


def add_server_options(p: argparse.ArgumentParser, *, admin: bool = True, metrics: bool = True) -> None:
    """The options of a verb that runs until interrupted: logging (``-v``, ``--log-format``),
    the status socket (``--admin PATH``, ``--no-admin``) and ``--metrics HOST:PORT``."""
    add_logging_options(p)
    if admin:
        group = p.add_mutually_exclusive_group()
        group.add_argument(
            "--admin",
            default=None,
            metavar="PATH",
            help="serve `iac status` on this UNIX socket (mode 0600, in a private directory; "
            "default $XDG_RUNTIME_DIR/iac/ID.sock or ~/.iac/run/ID.sock, ID the AgentId's first 16 "
            "hex digits; 8 clients at once, each sending its request line within 1 s)",
        )
        group.add_argument("--no-admin", action="store_true", help="serve no status socket")
    if metrics:
        p.add_argument(
            "--metrics",
            default=None,
            metavar="HOST:PORT",
            help="serve Prometheus metrics at http://HOST:PORT/metrics (needs iac-mesh[metrics]; 16 "
            "connections at once, 4 per client address, each sending its request within 10 s)",
        )


def transport_config(args: argparse.Namespace, **extra: Any) -> TransportConfig:
    """The transport config of the CA options (``--ca`` needs ``--cert`` and ``--cert-key``) and
    ``--qlog``, with ``extra`` settings. Every verb decodes and announces the shipped dictionary
    (``dict_ids`` [39616] in its HELLO, as a library :class:`~iac.Node` does), so CLI traffic is
    compressed with it."""
    ca, cert, cert_key = (
        getattr(args, "ca", None),
        getattr(args, "cert", None),
        getattr(args, "cert_key", None),
    )
    if ca and not (cert and cert_key):
        raise ConfigError("--ca needs --cert and --cert-key too (make all three with `iac certs init`)")
    if (cert or cert_key) and not (cert and cert_key):
        raise ConfigError("--cert and --cert-key go together: give both (made by `iac certs init`)")
    for flag, path in (("--ca", ca), ("--cert", cert), ("--cert-key", cert_key)):
        if path is not None:
            _readable_file(flag, path)
    qlog = getattr(args, "qlog", None)
    if qlog is not None:
        extra["qlog_dir"] = _qlog_dir(qlog)
    congestion = getattr(args, "congestion", None)
    if congestion is not None:
        extra["congestion"] = congestion
    datagram = getattr(args, "max_datagram_size", None)
    if datagram == 0:
        extra["quic_pmtud"] = False
    elif datagram is not None:
        extra["quic_max_datagram_size"] = datagram
    if getattr(args, "no_quic_ack_frequency", False):
        extra["quic_ack_frequency"] = False
    extra.setdefault("dictionaries", DictionarySet([default_dictionary()]))
    return TransportConfig(ca_file=ca, cert_file=cert, key_file=cert_key, **extra)


def _readable_file(flag: str, path: str) -> None:
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a directory; give the PEM file (`iac certs init` writes them)")
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file; make the CA files with `iac certs init --dir DIR`")


def _qlog_dir(path: str) -> str:
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ConfigError(
            f"--qlog {path}: is a file; give a directory for the qlog files (created if missing)"
        )
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--qlog {path}: cannot create the directory ({exc.strerror}); give a writable one"
        ) from None
    return str(d)


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
        raise ConfigError(
            f"{what} is not JSON ({exc.args[0] if exc.args else exc}); quote it for the shell, "
            """e.g. '{"text": "hi"}' or '"a string"'"""
        ) from None


#: The most ``--payload @FILE`` or ``--payload -`` reads: a message's frame (4 MiB by default)
#: holds no more; a larger file goes with ``iac send-file``.
MAX_PAYLOAD_FILE = DEFAULT_MAX_FRAME_SIZE


def payload_arg(text: str, what: str = "--payload") -> Any:
    """A JSON argument given inline, as ``@FILE`` (read from FILE) or as ``-`` (read from standard
    input), at most :data:`MAX_PAYLOAD_FILE` bytes; :class:`ConfigError` naming ``what`` and the
    fix otherwise."""
    if text == "-":
        data = sys.stdin.buffer.read(MAX_PAYLOAD_FILE + 1)
        source = f"{what} - (standard input)"
    elif text.startswith("@"):
        path = Path(text[1:])
        source = f"{what} @{path}"
        if not text[1:]:
            raise ConfigError(f"{what} @: name the file after @, e.g. {what} @payload.json")
        try:
            with path.open("rb") as f:
                data = f.read(MAX_PAYLOAD_FILE + 1)
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such file; check the path (inline JSON needs no @)") from None
        except IsADirectoryError:
            raise ConfigError(f"{source}: is a directory; name a file with the JSON payload") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read it ({exc.strerror}); check its permissions") from None
    else:
        return json_arg(text, what)
    if len(data) > MAX_PAYLOAD_FILE:
        raise ConfigError(
            f"{source}: more than {MAX_PAYLOAD_FILE} bytes, more than a message carries; "
            "send a file with iac send-file"
        )
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(
            f"{source}: not UTF-8 text; a JSON payload is text (binary files: iac send-file)"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{source}: not JSON ({exc}); check the file's content") from None


def print_error(verb: str, exc: BaseException | str) -> None:
    """The one line on stderr for a verb that failed: ``iac VERB: error: TEXT``."""
    text = " ".join(str(exc).split()) or "failed"
    print(f"iac {verb}: error: {text}", file=sys.stderr)


__all__ = [
    "MAX_LIFETIME",
    "MAX_PAYLOAD_FILE",
    "MAX_TIMEOUT",
    "Parser",
    "add_listen_option",
    "add_registry_option",
    "add_server_options",
    "add_transport_options",
    "integer",
    "json_arg",
    "node_default",
    "payload_arg",
    "print_error",
    "print_listening",
    "seconds",
    "serve_until_signal",
    "transport_config",
]
