"""What the verbs that run a node until interrupted (``node``, ``registry``, ``a2a bridge``,
``a2a gateway``) share beyond their options: the metrics endpoint (``--metrics``), the status
socket (``--admin``, on by default) and the lines that tell a script where they are."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from iac.cli import checks
from iac.cli.options import print_listening, serve_until_signal
from iac.errors import ConfigError
from iac.integrations.admin import AdminSocket
from iac.integrations.scrape import parse_listen
from iac.node.node import Node

log = logging.getLogger("iac.cli")


def metrics_of(args: argparse.Namespace) -> Any | None:
    """The ``NodeMetrics`` of ``--metrics HOST:PORT`` (``Node(metrics=...)``), or None."""
    listen = getattr(args, "metrics", None)
    if listen is None:
        return None
    try:
        parse_listen(listen)
    except ConfigError:
        raise ConfigError(
            f"--metrics {listen!r:.60}: give HOST:PORT, e.g. --metrics 127.0.0.1:9464 "
            "(port 0 picks a free one)"
        ) from None
    try:
        from iac.integrations.metrics import NodeMetrics
    except ImportError:
        raise ConfigError("--metrics needs the Prometheus client: pip install 'iac-mesh[metrics]'") from None
    return NodeMetrics(listen=listen)


def start_admin(node: Node, args: argparse.Namespace) -> tuple[Path | None, Callable[[], None]]:
    """Serve the status socket of ``--admin PATH`` (default path unless ``--no-admin``): its path
    and the function that stops it. A default path that cannot be served is logged and skipped
    (the node runs on); a path given with ``--admin`` that cannot be served is an error."""
    if getattr(args, "no_admin", False) or not hasattr(args, "admin"):
        return None, lambda: None
    explicit = args.admin
    if explicit is not None and Path(explicit).is_dir():
        raise ConfigError(
            f"--admin {explicit}: is a directory; name the socket in it, "
            f"e.g. --admin {Path(explicit) / 'node.sock'}"
        )
    admin = AdminSocket(explicit)
    try:
        detach = admin.attach(node)
    except ConfigError as exc:
        if explicit is not None:
            text = str(exc).removeprefix(f"{Path(explicit)}: ")
            raise ConfigError(f"--admin {explicit}: {text}") from None
        log.warning("no status socket for `iac status`: %s", exc)
        return None, lambda: None
    return admin.path, detach


@contextlib.asynccontextmanager
async def running(node: Node, args: argparse.Namespace, metrics: Any = None) -> AsyncIterator[list[str]]:
    """Around a started node: its status socket; yields the lines to print once it is ready
    (``status PATH``, and ``metrics URL`` for the node's ``metrics``)."""
    path, detach = start_admin(node, args)
    lines: list[str] = []
    if path is not None:
        lines.append(f"status {path}")
    url = getattr(metrics, "url", None)
    if url:
        lines.append(f"metrics {url}")
    try:
        yield lines
    finally:
        detach()


def print_lines(lines: list[str]) -> None:
    """Print ``lines`` (flushed: a script waits for them)."""
    for line in lines:
        print(line, flush=True)


def node_listen(args: argparse.Namespace) -> list[str]:
    """``--listen`` values, checked (addresses, UNIX socket directories, sockets in use)."""
    return checks.listen_urls(args.listen)


__all__ = [
    "metrics_of",
    "node_listen",
    "print_lines",
    "print_listening",
    "running",
    "serve_until_signal",
    "start_admin",
]
