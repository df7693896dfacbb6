"""Logging for the long-running verbs of the ``iac`` command (``node``, ``registry``,
``a2a gateway``, ``a2a bridge``): ``-v``/``-vv`` and ``--log-format text|json``.

The library logs under one tree, named by layer (a module logs with ``logging.getLogger`` of its
layer, nothing else)::

    iac.node            the node: refusals, handler failures, closes it decides, delegation
    iac.transport       TLS/TCP and UNIX sockets: refused and failed connections, closes
    iac.transport.quic  the QUIC adapter: refused connections, session tickets
    iac.mesh            registry service and client: refused records, failed refreshes
    iac.stores          replay and record stores
    iac.integrations    metrics, tracing, A2A, the status socket
    iac.cli             the command line itself

A record carries, where they apply, these fields (``extra``): ``peer`` (the first 16 hex digits
of the peer's AgentId), ``transport`` (``quic``, ``tls``, ``unix``), ``msg_type`` (the type's
name, ``RUN``), ``msg_id``, ``reason`` (a refusal reason or an ERROR code) and ``code`` (a close
code's name). The text format prints them after the message in brackets; the JSON format
(one object per line) has them as keys next to ``time``, ``level``, ``logger`` and ``message``.

Levels: by default the ``iac`` tree logs warnings; ``-v`` adds INFO (refused connections and
messages, closes), ``-vv`` DEBUG. aioquic's own logger (``quic``) stays at WARNING unless
``-vv`` (INFO: its connection events) or ``-vvv`` (DEBUG: every packet) asks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from typing import Any, TextIO

#: The loggers of the library, one per layer (``iac.transport.quic`` is under ``iac.transport``).
LOGGERS = (
    "iac.node",
    "iac.transport",
    "iac.transport.quic",
    "iac.mesh",
    "iac.stores",
    "iac.integrations",
    "iac.cli",
)
#: The extra fields a record may carry, in the order the text format prints them.
FIELDS = ("peer", "transport", "msg_type", "msg_id", "reason", "code")
#: aioquic's logger.
QUIC_LOGGER = "quic"
FORMATS = ("text", "json")

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_handler: logging.Handler | None = None


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record carries beyond the standard ones (its ``extra``), known fields first."""
    found = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
    ordered = {k: found.pop(k) for k in FIELDS if k in found}
    return ordered | found


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def _time(record: logging.LogRecord) -> str:
    when = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the record's extra fields, and ``exception`` (the traceback, as one string)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            out.setdefault(key, _plain(value))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE [field=value ...]``, then the traceback if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " [" + " ".join(f"{k}={_plain(v)}" for k, v in extras.items()) + "]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def levels(verbose: int) -> tuple[int, int]:
    """The level of the ``iac`` tree and of aioquic's ``quic`` logger for ``-v`` given ``verbose`` times."""
    iac_level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    quic_level = logging.WARNING if verbose <= 1 else logging.INFO if verbose == 2 else logging.DEBUG
    return iac_level, quic_level


def setup_logging(verbose: int = 0, fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Send log records to ``stream`` (stderr) in ``fmt`` (``text`` or ``json``), at the levels
    of :func:`levels`. Replaces what an earlier call set up; returns the handler."""
    global _handler
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    iac_level, quic_level = levels(verbose)
    logging.getLogger("iac").setLevel(iac_level)
    logging.getLogger(QUIC_LOGGER).setLevel(quic_level)
    _handler = handler
    return handler


def add_logging_options(p: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose`` (repeatable) and ``--log-format text|json``."""
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more to stderr: -v INFO, -vv DEBUG (and aioquic's INFO), -vvv aioquic's DEBUG",
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="log lines as text, or as JSON objects, one per line (default %(default)s)",
    )


def logging_from_args(args: argparse.Namespace) -> None:
    """Set up logging from :func:`add_logging_options`' options."""
    setup_logging(getattr(args, "verbose", 0), getattr(args, "log_format", "text"))


__all__ = [
    "FIELDS",
    "FORMATS",
    "LOGGERS",
    "JsonFormatter",
    "TextFormatter",
    "add_logging_options",
    "levels",
    "logging_from_args",
    "setup_logging",
]
