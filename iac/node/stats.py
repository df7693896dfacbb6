"""The node's counters (``node.stats()`` snapshots them into :class:`~iac.node.config.NodeStats`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from iac.node.config import NodeStats


class Counters:
    """Plain integer counters every collaborator of a node writes to (one object per node)."""

    __slots__ = (
        "acks_received",
        "acks_sent",
        "answers_too_large",
        "backlog_peak",
        "broadcasts_short",
        "broadcasts_unsent",
        "bytes_received",
        "bytes_sent",
        "cancelled",
        "closed_internal",
        "delivery_failures",
        "early_accepted",
        "early_dials",
        "early_received",
        "early_rejected",
        "errors_received",
        "errors_sent",
        "files_failed",
        "files_received",
        "files_resumed",
        "files_sent",
        "gaps",
        "handled",
        "late",
        "peer_events_dropped",
        "received",
        "refused",
        "relayed",
        "replies_sent",
        "resumed",
        "retransmits",
        "running_peak",
        "sent",
        "throttled",
    )

    def __init__(self) -> None:
        self.sent = self.received = self.bytes_sent = self.bytes_received = 0
        self.handled = self.replies_sent = self.acks_sent = self.acks_received = 0
        self.retransmits = self.delivery_failures = self.throttled = 0
        self.gaps = self.late = self.cancelled = self.peer_events_dropped = 0
        self.backlog_peak = self.running_peak = 0
        self.relayed = self.answers_too_large = self.closed_internal = 0
        self.files_sent = self.files_received = self.files_failed = self.files_resumed = 0
        self.resumed = self.early_dials = self.early_accepted = self.early_rejected = 0
        self.early_received = 0
        #: Own broadcasts sent to no peer; relayed broadcasts that reached fewer peers than
        #: the registry role of this node knows live records of (``stats().routing``).
        self.broadcasts_unsent = self.broadcasts_short = 0
        #: Refusals by :class:`~iac.errors.Refusal` value; ERRORs sent and received by code.
        self.refused: Counter[str] = Counter()
        self.errors_sent: Counter[str] = Counter()
        self.errors_received: Counter[str] = Counter()

    def snapshot(self, **gauges: Any) -> NodeStats:
        """These counters, with the queue depths and tables the node measures now, as NodeStats."""
        counts = {f.name: getattr(self, f.name) for f in dataclasses.fields(NodeStats) if f.name in _PLAIN}
        return NodeStats(
            **counts,
            refused=dict(self.refused),
            errors_sent=dict(self.errors_sent),
            errors_received=dict(self.errors_received),
            zero_rtt={name: getattr(self, name) for name in ZERO_RTT},
            **gauges,
        )


#: Counters that NodeStats groups in its ``zero_rtt`` mapping.
ZERO_RTT = ("resumed", "early_dials", "early_accepted", "early_rejected", "early_received")
_PLAIN = frozenset(Counters.__slots__) - {"refused", "errors_sent", "errors_received", *ZERO_RTT,
                                          "broadcasts_short", "broadcasts_unsent"}  # fmt: skip

__all__ = ["Counters"]
