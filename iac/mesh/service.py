"""The registry role: a node that answers registry requests from a :class:`~iac.RegistryState`.

The state keeps its records in a memory, SQLite or Redis store. Lookup replies carry the stored
signed records and rotation proofs, so a client checks them itself (:func:`~iac.verify_entry`):
the registry is trusted for completeness and freshness, never for authenticity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from iac.errors import ConfigError, IacError, MessageRejected
from iac.mesh.client import MeshClient  # re-exported for importers not yet updated
from iac.mesh.dispatch import RegisterKeyDispatcher
from iac.mesh.wire import (
    OP_PUBLISH,
    OP_REVOKE,
    OP_ROTATE,
    OP_STATUS,
    OPS,
    entry_from_json,  # re-exported for importers not yet updated
    entry_to_json,
    handler_error,
    lookup_request,  # re-exported for importers not yet updated
    payload_field,
    publish_request,  # re-exported for importers not yet updated
    revoke_request,  # re-exported for importers not yet updated
    rotate_request,  # re-exported for importers not yet updated
)
from iac.node.node import Node
from iac.node.observe import Observer
from iac.protocol.clock import Clock
from iac.protocol.record_store import MemoryRecordStore
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    decode_record,
)
from iac.protocol.registry import RegistryConfig, RegistryState
from iac.stores.records import open_record_store
from iac.wire.identity import check_agent_id, is_agent_id

log = logging.getLogger("iac.mesh")

#: A short broadcast is logged at most once per this many seconds (the count has them all).
SHORT_LOG_INTERVAL = 10.0


class _Reach(Observer):
    """Counts the broadcasts this registry relayed that reached fewer of the agents with a live
    record published here (in this process) than it knows: those agents have no connection to
    it, so a broadcast through it misses them (docs/PROTOCOL.md, "Relays and broadcast")."""

    def __init__(self, service: RegistryService) -> None:
        self.service = service
        self._logged = -SHORT_LOG_INTERVAL

    def flooded(self, origin: str, from_peer: str, to: list[str]) -> None:
        svc = self.service
        now = svc.clock.now_us()
        live = svc.live_agents(now)
        if not live:
            return
        reached = {origin, from_peer, *to}
        got = sum(1 for a in reached if a in live)
        if got >= len(live):
            return
        svc.short_broadcasts += 1
        svc.node.count_short_broadcast()
        if now / 1e6 - self._logged >= SHORT_LOG_INTERVAL:
            self._logged = now / 1e6
            log.warning(
                "registry: a broadcast from %s… reached %d of the %d agents with a live record here "
                "(the others have no connection to this registry)",
                origin[:16],
                got,
                len(live),
            )


class RegistryService:
    """Makes ``node`` answer registry requests from ``state`` (REGISTER_KEY, see :mod:`iac.mesh.wire`).

    ``clock`` decides expiry, grace periods and statement skew (default: the node's clock).
    A publish must come from the key it describes. Store calls of a SQLite or Redis store run
    in a worker thread, so the node's event loop never waits on them.
    """

    def __init__(self, node: Node, state: RegistryState, *, clock: Clock | None = None) -> None:
        self.node = node
        self.state = state
        self.clock: Clock = clock if clock is not None else node.clock
        self._offload = not isinstance(state.store, MemoryRecordStore)
        self.counts: dict[str, int] = dict.fromkeys(sorted(OPS), 0)
        self._dispatcher = RegisterKeyDispatcher.of(node)
        self._dispatcher.attach_registry(self)
        #: Agents that published here in this process, with their record's expiry (µs): whom a
        #: broadcast through this registry should reach. At most the store's record bound.
        self._live: dict[str, int] = {}
        self._pruned_us = 0
        #: Relayed broadcasts that reached fewer of them than this registry knows.
        self.short_broadcasts = 0
        self._unobserve = node.observe(_Reach(self))

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(fn) if self._offload else fn()

    async def handle(self, sender: str, payload: dict[str, Any], *, via: str | None = None) -> Any:
        """Answer one registry request from ``sender``, relayed by the neighbour ``via`` (None or
        ``sender``: direct; raises :class:`HandlerError`)."""
        op = payload["op"]
        try:
            result = await self._handle(sender, op, payload, via)
        except IacError as exc:
            log.info("registry: %s from %s… refused: %s", op, sender[:16], exc)
            raise handler_error(exc) from None
        self.counts[op] += 1
        return result

    def stats(self) -> dict[str, Any]:
        """Requests answered by op, and the neighbour bounds: publishes refused for their
        neighbour's quota, records evicted for direct publishes, keys brought in by neighbour."""
        st = self.state.stats
        return {"answered": dict(self.counts), "quota_refused": st.quota_refused, "evicted": st.evicted,
                "brought_in": dict(st.brought_in), "live_agents": len(self.live_agents(self.clock.now_us())),
                "short_broadcasts": self.short_broadcasts}  # fmt: skip

    def is_live(self, agent_id: str) -> bool:
        """Whether ``agent_id`` published a record here (in this process) that has not expired."""
        exp = self._live.get(agent_id)
        return exp is not None and exp > self.clock.now_us()

    def live_agents(self, now_us: int) -> dict[str, int]:
        """The agents that published here (in this process) whose record has not expired."""
        if now_us - self._pruned_us >= 1_000_000:  # at most once a second: O(records)
            self._pruned_us = now_us
            for aid in [a for a, exp in self._live.items() if exp <= now_us]:
                del self._live[aid]
        return self._live

    async def _handle(self, sender: str, op: str, payload: dict[str, Any], via: str | None) -> Any:
        now = self.clock.now_us()
        state = self.state
        if op == OP_PUBLISH:
            signed = SignedRecord.from_json_obj(payload_field(payload, "record"))
            claimed = decode_record(signed.data, max_size=state.config.max_record_size)
            if claimed.agent_id != sender:
                raise MessageRejected(
                    "a record must be published by the key it describes (from != agent_id)",
                    reason="bad_record",
                )
            record: AgentRecord = await self._run(lambda: state.publish(signed, now, via=via))
            if len(self._live) < state.config.max_keys or record.agent_id in self._live:
                self._live[record.agent_id] = record.expires_us
            return {"op": op, "agent_id": record.agent_id, "seq": record.seq, "expires_us": record.expires_us}
        if op == OP_ROTATE:
            rot = SignedRotation.from_json_obj(payload_field(payload, "rotation"))
            st: RotationStatement = await self._run(lambda: state.apply_rotation(rot, now))
            return {"op": op, "old_agent_id": st.old_agent_id, "new_agent_id": st.new_agent_id, "seq": st.seq}
        if op == OP_REVOKE:
            rev = SignedRevocation.from_json_obj(payload_field(payload, "revocation"))
            r: Revocation = await self._run(lambda: state.apply_revocation(rev, now))
            self._live.pop(r.agent_id, None)
            return {"op": op, "agent_id": r.agent_id, "seq": r.seq}
        if op == OP_STATUS:
            aid = payload_field(payload, "agent_id")
            if not isinstance(aid, str) or not is_agent_id(aid):
                raise MessageRejected("status needs an AgentId", reason="bad_record")
            info = await self._run(lambda: state.key_status(aid, now))
            return {"op": op, "agent_id": aid, "status": info.status.value, "seq": info.seq,
                    "successor": info.successor}  # fmt: skip
        # lookup
        keys = {"agent_id", "alias", "capability"} & set(payload)
        if len(keys) != 1 or set(payload) - {"op", "agent_id", "alias", "capability", "limit"}:
            raise MessageRejected(
                "a lookup names exactly one of agent_id, alias, capability (and limit)", reason="bad_record"
            )
        key = keys.pop()
        value = payload[key]
        if not isinstance(value, str):
            raise MessageRejected(f"lookup {key} must be a string", reason="bad_record")
        try:
            if key == "agent_id":
                check_agent_id(value)
                one = await self._run(lambda: state.lookup_id(value, now))
                entries = [one] if one is not None else []
            elif key == "alias":
                one = await self._run(lambda: state.lookup_alias(value, now))
                entries = [one] if one is not None else []
            else:
                limit = payload.get("limit")
                if limit is not None and (type(limit) is not int or limit < 1):
                    raise MessageRejected("limit must be a positive integer", reason="bad_record")
                entries = await self._run(lambda: state.lookup_capability(value, now, limit))
        except ConfigError as exc:
            raise MessageRejected(str(exc), reason="bad_record") from None
        return {"op": op, "entries": [entry_to_json(e) for e in entries]}

    def close(self) -> None:
        """Leave the registry role: the node answers REGISTER_KEY requests ``no_handler`` again."""
        self._dispatcher.detach_registry(self)
        self._unobserve()


def serve_registry(
    node: Node,
    store: RegistryState | str = "memory",
    *,
    config: RegistryConfig | None = None,
    clock: Clock | None = None,
) -> RegistryService:
    """Put ``node`` in the registry role over a state, or a store spec (``memory``,
    ``sqlite:PATH``, ``redis://HOST:PORT``)."""
    if isinstance(store, str):
        store = RegistryState(open_record_store(store), config)
    return RegistryService(node, store, clock=clock)


__all__ = [
    "MeshClient",
    "RegistryService",
    "entry_from_json",
    "lookup_request",
    "publish_request",
    "revoke_request",
    "rotate_request",
    "serve_registry",
]
