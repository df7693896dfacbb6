"""The node layer: :class:`Node`, what it is configured with and what it hands to agent code.

:mod:`~iac.node.node` is the facade agent code calls; :mod:`~iac.node.runtime` wires the
collaborators, each with one job (peers, outbox, pending, pipeline, inbound, dispatch, ordered,
files, answers).
"""

from iac.node.config import NodeConfig, NodeStats, PeerEvent, Topology
from iac.node.node import Context, Node
from iac.node.observe import Observer
from iac.node.peers import Paths
from iac.node.types import Broadcast, FileSent, ReceivedFile, Reply, SendOptions, Sent

__all__ = [
    "Broadcast",
    "Context",
    "FileSent",
    "Node",
    "NodeConfig",
    "NodeStats",
    "Observer",
    "Paths",
    "PeerEvent",
    "ReceivedFile",
    "Reply",
    "SendOptions",
    "Sent",
    "Topology",
]
