"""What most collaborators of one node share, in one value given to their constructors.

The runtime (:mod:`iac.node.runtime`) makes one :class:`Parts` per node and hands it to each
collaborator that needs several of these, with the collaborators it talks to as further
arguments: nothing is wired by assigning attributes after construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from iac.node.config import NodeConfig
from iac.node.observe import Observers
from iac.node.stats import Counters
from iac.node.store import StoreRunner
from iac.node.tasks import TaskSet
from iac.node.types import Sessions
from iac.protocol.clock import Clock
from iac.protocol.routing import Router
from iac.wire.identity import Identity


@dataclass(frozen=True, slots=True)
class Parts:
    """One node's shared parts (each made once, by the runtime)."""

    identity: Identity
    config: NodeConfig
    #: This node's sending sessions, by peer and kind.
    sessions: Sessions
    router: Router
    counters: Counters
    #: The node's background tasks (cancelled on close).
    tasks: TaskSet
    observers: Observers
    #: What the receive side judges freshness, replay windows and expiry by: the node's clock,
    #: except where it jumps (docs/PROTOCOL.md, "Replay and freshness").
    rx_clock: Clock
    #: The replay store's calls (its store is given when the node starts).
    store: StoreRunner


__all__ = ["Parts"]
