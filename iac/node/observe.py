"""Hooks for what watches a node: metrics, tracing, a status view (the optional integrations in
:mod:`iac.integrations` implement them). A node with no observer pays one empty-list check at
each hook.

Counters and queue depths are not pushed through hooks: an observer reads ``node.stats()`` when
it is asked (a Prometheus scrape, ``iac status``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from iac.wire._pb.iac_pb2 import Message

log = logging.getLogger("iac.node")


class Observer:
    """Override what you need; every hook here does nothing. Hooks run on the event loop, inline:
    keep them short, and never raise (an exception is logged and the hook is skipped)."""

    def outgoing(self, msg: Message) -> None:
        """A message this node built, before it is signed: a tracer may set its trace context
        (field 16), which the signature then covers."""

    def handling(self, peer: str, msg: Message) -> AbstractContextManager[Any]:
        """Entered around a handler run (the handler sees what it sets in context variables)."""
        return contextlib.nullcontext()

    def answered(self, peer: str, msg_type: int, seconds: float, outcome: str) -> None:
        """A request this node sent is over after ``seconds``: ``outcome`` is ``reply``, the ERROR
        code, ``timeout``, ``transport`` (it could not be sent or the connection failed) or
        ``cancelled`` (the caller gave up)."""

    def relayed(self, origin: str, msg: Message, from_peer: str, to: list[str]) -> None:
        """This node sent on a FORWARD that ``origin`` signed (a relay hop or a broadcast flood)."""

    def flooded(self, origin: str, from_peer: str, to: list[str]) -> None:
        """A broadcast that ``origin`` signed arrived from ``from_peer`` and was delivered here;
        this node sent it on to ``to`` (maybe none)."""


class Attachable(Protocol):
    """What ``Node(metrics=...)`` takes: an integration that attaches itself to the node."""

    def attach(self, node: Any) -> Callable[[], None]: ...


class Observers:
    """The observers of one node; each hook is called on every observer, and one that raises is
    logged and skipped (an observer never breaks message handling)."""

    def __init__(self) -> None:
        #: The observers; the hot paths test this list (not the object: that would be a call).
        self.items: list[Observer] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, observer: Observer) -> Callable[[], None]:
        self.items.append(observer)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self.items.remove(observer)

        return remove

    def outgoing(self, msg: Message) -> None:
        for o in self.items:
            try:
                o.outgoing(msg)
            except Exception:
                log.exception("observer %r failed", o)

    def handling(self, peer: str, msg: Message) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for o in self.items:
            try:
                stack.enter_context(o.handling(peer, msg))
            except Exception:
                log.exception("observer %r failed", o)
        return stack

    def answered(self, peer: str, msg_type: int, seconds: float, outcome: str) -> None:
        for o in self.items:
            try:
                o.answered(peer, msg_type, seconds, outcome)
            except Exception:
                log.exception("observer %r failed", o)

    def relayed(self, origin: str, msg: Message, from_peer: str, to: list[str]) -> None:
        for o in self.items:
            try:
                o.relayed(origin, msg, from_peer, to)
            except Exception:
                log.exception("observer %r failed", o)

    def flooded(self, origin: str, from_peer: str, to: list[str]) -> None:
        for o in self.items:
            try:
                o.flooded(origin, from_peer, to)
            except Exception:
                log.exception("observer %r failed", o)


__all__ = ["Attachable", "Observer", "Observers"]
