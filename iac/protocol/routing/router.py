"""The router: broadcast flooding and relayed unicast, sans-IO (time and peers are arguments).

Broadcasts (empty ``to``) are flooded: a node delivers a broadcast to its own
handler and sends it on to every connected peer except the one it came from
and those already in ``path``. Each ``(from, session_id, msg_id)`` is
delivered and forwarded at most once: a bounded seen-cache holds the keys of
verified broadcasts for ``2 * max_skew`` (a copy arriving later carries a
timestamp older than ``max_skew`` and is refused as stale anyway). A copy
whose key is in the cache is dropped and counted as a duplicate before its
signature is checked (dropping a forgery of something already delivered costs
nothing; only verified messages enter the cache, so a forgery cannot suppress
a real broadcast). When the cache is full of unexpired keys a new broadcast
is refused (``seen_cache_full``) rather than evicting a key, which could
deliver something twice.

Unicast relaying: a Forward whose ``to`` is this node is delivered. Otherwise
the node relays it if its :class:`RelayPolicy` allows, to ``to`` when that is
a connected peer, else to the next hop its route table names. Exact copies
(same ``from``, ``session_id``, ``msg_id`` and ``timestamp``) are relayed and
delivered once; a retransmission (same ids, fresh timestamp, new signature)
passes, so that the final receiver can answer it again.

Replies route back the way the request came: every node that receives a
verified, first-seen unicast Forward learns a reverse route "``from`` is
reached through the neighbour it came from" (the authenticated neighbour, not
the unauthenticated ``path``). A reply is a unicast to the requester, so it
follows those routes hop by hop back along the reversed path. A relay
remembers the requests it relayed, and relays the matching REPLY, ERROR or ACK
(``to`` = requester, ``from`` = the request's ``to``, and ``reply_session_id``,
``reply_to`` = the request's ids) even when its policy would not relay that
origin (``relay_replies``, on by default).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

from iac.errors import ConfigError, IacError, MessageRejected, ProtocolError, RoutingError
from iac.protocol.replay import DEFAULT_MAX_SKEW_US, check_freshness
from iac.protocol.routing.decisions import RelayPolicy, RouteDecision, RouteRefusal, RouterStats, Send
from iac.protocol.routing.forward import (
    MAX_PATH,
    U32,
    ForwardEnvelope,
    parse_forward,
    parse_inner_message,
    require_agent_id,
    wrap_forward,
)
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.identity import Domain, verify
from iac.wire.message import sender_of

DEFAULT_HOP_LIMIT = 8
#: Enough for a ring of 32 nodes; a broadcast reaches nodes at most this many links away.
DEFAULT_BROADCAST_HOP_LIMIT = 16
DEFAULT_MAX_SEEN = 100_000
DEFAULT_MAX_ROUTES = 10_000

_RESPONSE_TYPES: frozenset[int] = frozenset({MessageType.REPLY, MessageType.ERROR, MessageType.ACK})


class _ExpiringSet:
    """Keys with an expiry time, oldest first, bounded; full means full (no eviction of live keys)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[Any, ...], int] = OrderedDict()

    def __contains__(self, key: tuple[Any, ...]) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def expire(self, now_us: int) -> int:
        n = 0
        while self._items:
            key, expires = next(iter(self._items.items()))
            if expires >= now_us:
                break
            del self._items[key]
            n += 1
        return n

    def add(self, key: tuple[Any, ...], expires_us: int, now_us: int) -> bool:
        """Insert ``key``; False when full of unexpired keys."""
        if len(self._items) >= self.capacity:
            self.expire(now_us)
            if len(self._items) >= self.capacity:
                return False
        self._items[key] = expires_us
        return True


class Router:
    """Routing decisions for one node (``me``). Sans-IO: peers and time are arguments.

    ``peers`` is the set of AgentIds with a live connection (authenticated by
    HELLO); ``now_us`` is wall-clock microseconds (compared with message
    timestamps, ``max_skew_us`` either way).
    """

    def __init__(
        self,
        me: str,
        policy: RelayPolicy | None = None,
        *,
        max_skew_us: int = DEFAULT_MAX_SKEW_US,
        max_seen: int = DEFAULT_MAX_SEEN,
        max_routes: int = DEFAULT_MAX_ROUTES,
        broadcast_hop_limit: int = DEFAULT_BROADCAST_HOP_LIMIT,
        unicast_hop_limit: int = DEFAULT_HOP_LIMIT,
    ) -> None:
        self.me = require_agent_id(me, "me")
        self.policy = policy or RelayPolicy()
        if max_skew_us <= 0 or max_seen < 1 or max_routes < 1:
            raise ConfigError("max_skew_us, max_seen and max_routes must be positive")
        if not 1 <= broadcast_hop_limit <= U32 or not 1 <= unicast_hop_limit <= U32:
            raise ConfigError("hop limits must be at least 1")
        self.max_skew_us = max_skew_us
        self.retention_us = 2 * max_skew_us
        self.broadcast_hop_limit = broadcast_hop_limit
        self.unicast_hop_limit = unicast_hop_limit
        self.max_routes = max_routes
        self.stats = RouterStats()
        self._seen = _ExpiringSet(max_seen)
        self._relayed_requests: OrderedDict[tuple[str, int, int], tuple[str, int]] = OrderedDict()
        self._routes: OrderedDict[str, tuple[str, int | None]] = OrderedDict()
        #: Per origin: [messages, bytes, last seen (s)] left of its relay share.
        self._shares: OrderedDict[str, list[float]] = OrderedDict()

    # -- routes ---------------------------------------------------------------------------------

    def add_route(self, dest: str, next_hop: str, expires_us: int | None = None) -> None:
        """Reach ``dest`` through the peer ``next_hop`` (None: until replaced or removed)."""
        require_agent_id(dest, "dest")
        require_agent_id(next_hop, "next_hop")
        self._routes[dest] = (next_hop, expires_us)
        self._routes.move_to_end(dest)
        while len(self._routes) > self.max_routes:
            self._routes.popitem(last=False)

    def remove_route(self, dest: str) -> None:
        self._routes.pop(dest, None)

    @property
    def route_count(self) -> int:
        """Routes held (static and learned; learned ones expire)."""
        return len(self._routes)

    def next_hop(self, dest: str, peers: Collection[str], now_us: int) -> str | None:
        """The peer to send toward ``dest``: ``dest`` itself when connected, else its route's next hop."""
        if dest in peers:
            return dest
        entry = self._routes.get(dest)
        if entry is None:
            return None
        hop, expires = entry
        if expires is not None and expires < now_us:
            del self._routes[dest]
            return None
        return hop if hop in peers else None

    def expire(self, now_us: int) -> int:
        """Drop expired seen-keys, relayed-request records and learned routes; return how many."""
        n = self._seen.expire(now_us)
        for key in [k for k, (_, exp) in self._relayed_requests.items() if exp < now_us]:
            del self._relayed_requests[key]
            n += 1
        for dest in [d for d, (_, exp) in self._routes.items() if exp is not None and exp < now_us]:
            del self._routes[dest]
            n += 1
        return n

    # -- origination ----------------------------------------------------------------------------

    def originate_broadcast(
        self, message: bytes, peers: Iterable[str], now_us: int, hop_limit: int | None = None
    ) -> list[Send]:
        """Forwards that start a broadcast of this node's signed ``message`` (``to`` empty) to ``peers``.

        The key is entered in the seen-cache, so copies that come back are dropped.
        """
        msg, _, _ = parse_inner_message(message)
        if msg.to:
            raise ConfigError("a broadcast has an empty `to`")
        if sender_of(msg) != self.me:
            raise ConfigError("a node originates only its own messages")
        if not self._remember(("b", self.me, msg.session_id, msg.msg_id), now_us):
            raise RoutingError("the broadcast seen-cache is full", reason="seen_cache_full")
        limit = min(hop_limit or self.broadcast_hop_limit, self.policy.max_hop_limit)
        body = wrap_forward(message, limit, (self.me,))
        sends = [Send(p, body) for p in sorted(set(peers)) if p != self.me]
        self.stats.originated += 1
        self.stats.forwarded += len(sends)
        return sends

    def originate(
        self,
        message: bytes,
        peers: Collection[str],
        now_us: int,
        *,
        via: str | None = None,
        hop_limit: int | None = None,
    ) -> Send:
        """The Forward that sends this node's signed unicast ``message`` toward its ``to``.

        The first hop is ``via`` when given, else ``to`` when connected, else
        the route table's next hop (a learned reverse route for a reply).
        Raises ``no_route`` when there is none.
        """
        msg, _, _ = parse_inner_message(message)
        to = msg.to
        if not to:
            raise ConfigError("use originate_broadcast for a message with an empty `to`")
        if sender_of(msg) != self.me:
            raise ConfigError("a node originates only its own messages")
        hop = via if via is not None else self.next_hop(to, peers, now_us)
        if hop is None or hop not in peers:
            raise RoutingError(f"no connected peer or route toward {to[:16]}…", reason="no_route")
        limit = min(hop_limit or self.unicast_hop_limit, self.policy.max_hop_limit)
        self.stats.originated += 1
        self.stats.forwarded += 1
        return Send(hop, wrap_forward(message, limit, (self.me,)))

    # -- receiving ------------------------------------------------------------------------------

    def on_forward(self, data: bytes, from_peer: str, peers: Collection[str], now_us: int) -> RouteDecision:
        """Decide what to do with Forward bytes received from the connected peer ``from_peer``.

        Checks, cheapest first: the Forward's shape and path ids; the inner
        message's field-8 scan and parse; a broadcast already seen (dropped as a
        duplicate); ``hop_limit`` 0; this node in ``path`` (loop); the path's
        ends; the origin's signature; freshness. Then a broadcast is delivered
        and re-flooded; a unicast to this node is delivered; another unicast is
        relayed if the policy allows and a next hop exists.
        """
        try:
            env = parse_forward(data)
        except ProtocolError as exc:
            if exc.row.counter != RouteRefusal.MALFORMED:
                raise
            return self._refuse(RouteRefusal.MALFORMED, exc)
        except RoutingError as exc:
            return self._refuse(RouteRefusal.BAD_PATH, exc)
        try:
            msg, unsigned, signature = parse_inner_message(env.message)
        except ProtocolError as exc:
            if exc.row.counter != RouteRefusal.MALFORMED:
                raise
            return self._refuse(RouteRefusal.MALFORMED, exc, env)
        origin = sender_of(msg)
        broadcast = not msg.to
        key: tuple[Any, ...] = (
            ("b", origin, msg.session_id, msg.msg_id)
            if broadcast
            else ("u", origin, msg.session_id, msg.msg_id, msg.timestamp)
        )
        if key in self._seen:
            self.stats.duplicates += 1
            self.stats.refused[RouteRefusal.DUPLICATE] += 1
            return RouteDecision(
                refusal=RouteRefusal.DUPLICATE, origin=origin, hop_limit=env.hop_limit, path=env.path
            )
        if env.hop_limit == 0:
            return self._refuse(
                RouteRefusal.HOP_LIMIT_EXHAUSTED,
                RoutingError("Forward arrived with hop_limit 0", reason="hop_limit_exhausted"),
                env,
            )
        if self.me in env.path:
            return self._refuse(
                RouteRefusal.LOOP,
                RoutingError("this node is already in the path", reason="routing_loop"),
                env,
            )
        bad_path = self._check_path(env.path, origin, from_peer)
        if bad_path is not None:
            return self._refuse(RouteRefusal.BAD_PATH, RoutingError(bad_path, reason="bad_forward_path"), env)
        try:
            verify(origin, Domain.MESSAGE, unsigned, signature)
        except MessageRejected as exc:
            return self._refuse(RouteRefusal.BAD_SIGNATURE, exc, env)
        try:
            check_freshness(msg.timestamp, now_us, self.max_skew_us)
        except MessageRejected as exc:
            return self._refuse(RouteRefusal.STALE, exc, env)
        if broadcast:
            return self._on_broadcast(env, msg, key, from_peer, peers, now_us)
        return self._on_unicast(env, msg, key, from_peer, peers, now_us)

    def _check_path(self, path: tuple[str, ...], origin: str, from_peer: str) -> str | None:
        if not path:
            return "path is empty"
        if path[0] != origin:
            return "path does not start with the message's origin"
        if path[-1] != from_peer:
            return "path does not end with the neighbour it came from"
        if len(set(path)) != len(path):
            return "path repeats an id"
        return None

    def _on_broadcast(
        self,
        env: ForwardEnvelope,
        msg: Message,
        key: tuple[Any, ...],
        from_peer: str,
        peers: Collection[str],
        now_us: int,
    ) -> RouteDecision:
        origin = sender_of(msg)
        if not self._remember(key, now_us):
            return self._seen_cache_full(env)
        self.stats.delivered += 1

        def delivered(sends: tuple[Send, ...] = (), refusal: RouteRefusal | None = None) -> RouteDecision:
            return RouteDecision(
                message=msg,
                message_bytes=env.message,
                sends=sends,
                refusal=refusal,
                error=RoutingError(
                    "this node does not re-flood broadcasts from this origin", reason="relay_denied"
                )
                if refusal
                else None,
                origin=origin,
                hop_limit=env.hop_limit,
                path=env.path,
            )

        if not self.policy.allows_broadcast(origin):
            self.stats.refused[RouteRefusal.RELAY_DENIED] += 1
            return delivered(refusal=RouteRefusal.RELAY_DENIED)
        limit = self._relay_limit(env)
        if limit < 1:
            self.stats.flood_ends += 1
            return delivered()
        on_path = set(env.path)
        targets = sorted(p for p in peers if p != from_peer and p not in on_path and p != self.me)
        if not targets:
            return delivered()
        body = wrap_forward(env.message, limit, (*env.path, self.me))
        self.stats.forwarded += len(targets)
        return delivered(sends=tuple(Send(p, body) for p in targets))

    def _on_unicast(
        self,
        env: ForwardEnvelope,
        msg: Message,
        key: tuple[Any, ...],
        from_peer: str,
        peers: Collection[str],
        now_us: int,
    ) -> RouteDecision:
        origin = sender_of(msg)
        to = msg.to
        if to != self.me and not self._relay_allowed(msg, origin, to):
            return self._refuse(
                RouteRefusal.RELAY_DENIED,
                RoutingError("this node does not relay that message", reason="relay_denied"),
                env,
            )
        if to == self.me:
            if not self._remember(key, now_us):
                return self._seen_cache_full(env)
            self._learn(origin, from_peer, now_us)
            self.stats.delivered += 1
            return RouteDecision(
                message=msg, message_bytes=env.message, origin=origin, hop_limit=env.hop_limit, path=env.path
            )
        limit = self._relay_limit(env)
        if limit < 1:
            return self._refuse(
                RouteRefusal.HOP_LIMIT_EXHAUSTED,
                RoutingError("no hop left to relay on", reason="hop_limit_exhausted"),
                env,
            )
        hop = self.next_hop(to, peers, now_us)
        if hop is None or hop == from_peer or hop in env.path:
            return self._refuse(
                RouteRefusal.NO_ROUTE, RoutingError(f"no route toward {to[:16]}…", reason="no_route"), env
            )
        if not self._take_share(origin, len(env.message), now_us):
            return self._refuse(
                RouteRefusal.RELAY_RATE,
                RoutingError(f"{origin[:16]}… spent its share of this relay", reason="relay_rate"),
                env,
            )
        if not self._remember(key, now_us):
            return self._seen_cache_full(env)
        self._learn(origin, from_peer, now_us)
        if msg.msg_type not in _RESPONSE_TYPES:
            expires = now_us + self.retention_us
            if msg.deadline:
                expires = min(expires, msg.deadline)
            self._relayed_requests[(origin, msg.session_id, msg.msg_id)] = (to, expires)
            while len(self._relayed_requests) > self.max_routes:
                self._relayed_requests.popitem(last=False)
        self.stats.forwarded += 1
        send = Send(hop, wrap_forward(env.message, limit, (*env.path, self.me)))
        return RouteDecision(
            sends=(send,), message_bytes=env.message, origin=origin, hop_limit=env.hop_limit, path=env.path
        )

    def _take_share(self, origin: str, size: int, now_us: int) -> bool:
        """One relayed message of ``size`` bytes from ``origin`` against its token buckets
        (``RelayPolicy.origin_rate`` / ``origin_bytes``); True when it fits."""
        pol = self.policy
        if pol.origin_rate is None and pol.origin_bytes is None:
            return True
        now = now_us / 1e6
        share = self._shares.pop(origin, None)
        if share is None:
            share = [float(pol.origin_burst), float(pol.origin_burst_bytes), now]
        elapsed = max(0.0, now - share[2])
        share[2] = now
        if pol.origin_rate is not None:
            share[0] = min(float(pol.origin_burst), share[0] + elapsed * pol.origin_rate)
        if pol.origin_bytes is not None:
            share[1] = min(float(pol.origin_burst_bytes), share[1] + elapsed * pol.origin_bytes)
        self._shares[origin] = share  # most recently seen last
        while len(self._shares) > pol.max_origins:
            self._shares.popitem(last=False)
        over_rate = pol.origin_rate is not None and share[0] < 1
        if over_rate or (pol.origin_bytes is not None and share[1] < size):
            return False
        share[0] -= 1
        share[1] -= size
        return True

    def _relay_limit(self, env: ForwardEnvelope) -> int:
        """The hop limit to send ``env`` on with: one less, clamped by the policy, and no more hops
        than its path has room for (this node's id is appended; a path holds :data:`MAX_PATH` ids)."""
        return min(env.hop_limit - 1, self.policy.max_hop_limit, MAX_PATH - len(env.path))

    def _learn(self, origin: str, from_peer: str, now_us: int) -> None:
        """The reverse route: replies to ``origin`` go back through the neighbour this came from.

        A static route (no expiry) is never replaced by a learned one.
        """
        if origin == from_peer:
            return
        entry = self._routes.get(origin)
        if entry is not None and entry[1] is None:
            return
        self.add_route(origin, from_peer, now_us + self.retention_us)

    def _relay_allowed(self, msg: Message, origin: str, to: str) -> bool:
        if self.policy.allows_unicast(origin, to):
            return True
        if self.policy.relay_replies and msg.msg_type in _RESPONSE_TYPES:
            entry = self._relayed_requests.get((to, msg.reply_session_id, msg.reply_to))
            return entry is not None and entry[0] == origin
        return False

    def _remember(self, key: tuple[Any, ...], now_us: int) -> bool:
        """Enter ``key`` in the seen-cache until it could no longer pass as fresh; False when full."""
        return self._seen.add(key, now_us + self.retention_us, now_us)

    def _seen_cache_full(self, env: ForwardEnvelope) -> RouteDecision:
        return self._refuse(
            RouteRefusal.SEEN_CACHE_FULL, RoutingError("seen-cache is full", reason="seen_cache_full"), env
        )

    def _refuse(
        self, refusal: RouteRefusal, error: IacError, env: ForwardEnvelope | None = None
    ) -> RouteDecision:
        self.stats.refused[refusal] += 1
        if env is None:
            return RouteDecision(refusal=refusal, error=error)
        return RouteDecision(refusal=refusal, error=error, hop_limit=env.hop_limit, path=env.path)

    def __repr__(self) -> str:
        return f"Router(me={self.me[:16]}…, seen={len(self._seen)}, routes={len(self._routes)})"
