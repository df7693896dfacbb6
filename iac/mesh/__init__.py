"""The mesh layer: the roles a :class:`~iac.Node` takes on top of messaging.

* :class:`RegistryService` (:func:`serve_registry`) makes a node answer registry requests
  (publish, rotate, revoke, lookup, status: :mod:`iac.mesh.wire`) from a
  :class:`~iac.RegistryState` in a memory, SQLite or Redis store. Lookup replies carry the
  signed records and rotation proofs, so the registry is trusted for completeness and
  freshness, never for authenticity.
* :class:`MeshClient` publishes its node's record and keeps it fresh, resolves aliases and
  capabilities, retries once after a failed dial, delegates by capability, and rotates or
  revokes its key.
* :class:`Traversal` takes a node through NATs: observed addresses, candidates, QUIC hole
  punching coordinated over a relay path, relay fallback and upgrade (:mod:`iac.mesh.nat`).
* :class:`KeyBook` is a client's verified cache; :func:`registry_admission` and
  :meth:`KeyBook.guard` turn a registry state or a key book into the node's HELLO admission
  policy and a content guard that refuses ended keys.

Each role is composed with its node: it installs the node's REGISTER_KEY handler
(:class:`~iac.mesh.dispatch.RegisterKeyDispatcher`) or joins the one installed, and leaves it
again when closed.
"""

from iac.mesh.client import DelegationPolicy, MeshClient
from iac.mesh.keybook import KeyBook, move_peer, registry_admission
from iac.mesh.nat import Traversal
from iac.mesh.registries import RegistryAddr, parse_registry
from iac.mesh.service import RegistryService, serve_registry
from iac.mesh.wire import (
    OPS,
    entry_from_json,
    entry_to_json,
    lookup_request,
    publish_request,
    raise_remote,
    revoke_request,
    rotate_request,
)

__all__ = [
    "OPS",
    "DelegationPolicy",
    "KeyBook",
    "MeshClient",
    "RegistryAddr",
    "RegistryService",
    "Traversal",
    "entry_from_json",
    "entry_to_json",
    "lookup_request",
    "move_peer",
    "parse_registry",
    "publish_request",
    "raise_remote",
    "registry_admission",
    "revoke_request",
    "rotate_request",
    "serve_registry",
]
