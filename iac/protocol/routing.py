"""Broadcast flooding and relayed routing of FORWARD frames, sans-IO: time and peers are arguments.

A FORWARD frame carries ``iac.Forward``::

    message Forward { uint32 hop_limit = 1; repeated string path = 2; bytes message = 3; }

* ``message`` is the origin's signed ``Message`` bytes, *unchanged*: every
  receiver verifies the origin's signature over them (never a relay's), so a
  relay that alters one byte is caught. ``hop_limit`` and ``path`` are
  hop-by-hop metadata that the signature does not cover (like an IP TTL):
  a relay could lie in them, and the checks below only use them to stop
  floods and loops early.
* ``hop_limit``: how many more links the Forward may cross, at least 1 when
  sent. The origin sets it (:data:`DEFAULT_HOP_LIMIT` for unicast,
  :data:`DEFAULT_BROADCAST_HOP_LIMIT` for broadcasts); a relay sends
  ``min(hop_limit - 1, policy.max_hop_limit)``, and does not send when that is 0.
  A received Forward with ``hop_limit`` 0 is refused (``hop_limit_exhausted``).
* ``path``: the AgentIds that sent this Forward so far, origin first; each
  sender appends its own id before sending. A receiver checks that the path
  is at most :data:`MAX_PATH` well-formed ids without repeats, that it starts
  with the inner message's ``from`` and ends with the neighbour it came from
  (the peer the connection's HELLO proved), and refuses it as a loop when its
  own id is already in it.

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

import hashlib
import json
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from iac.errors import (
    BadForwardPath,
    BadSignature,
    ConfigError,
    HopLimitExhausted,
    IacError,
    InvalidAgentId,
    MessageFormatError,
    NoRoute,
    RelayDenied,
    RoutingError,
    RoutingLoop,
    SeenCacheFull,
    StaleMessage,
)
from iac.protocol.replay import DEFAULT_MAX_SKEW_US, check_freshness
from iac.wire._pb.iac_pb2 import Forward, Message, MessageType
from iac.wire.identity import Domain, is_agent_id, verify
from iac.wire.message import sender_of
from iac.wire.scan import LEN, MESSAGE_SCHEMA, VARINT, Schema, excise_signature, validate

DEFAULT_HOP_LIMIT = 8
#: Enough for a ring of 32 nodes; a broadcast reaches nodes at most this many links away.
DEFAULT_BROADCAST_HOP_LIMIT = 16
#: The largest hop limit a node sends on (larger ones are clamped).
MAX_HOP_LIMIT = 64
MAX_PATH = 64
DEFAULT_MAX_SEEN = 100_000
DEFAULT_MAX_ROUTES = 10_000
U32 = (1 << 32) - 1

FORWARD_SCHEMA = Schema("Forward", {1: (VARINT,), 2: (LEN,), 3: (LEN,)}, frozenset({2}), {})

_RESPONSE_TYPES = frozenset({MessageType.REPLY, MessageType.ERROR, MessageType.ACK})


def _local_agent_id(value: str, what: str) -> str:
    """An AgentId passed by the caller: a malformed one is a :class:`ConfigError` (local misuse)."""
    if not is_agent_id(value):
        raise ConfigError(f"{what} must be an AgentId (64 lowercase hex characters), got {value!r:.80}")
    return value


class RouteRefusal(StrEnum):
    """Why :meth:`Router.on_forward` refused (a key of ``RouterStats.refused``).

    ``code`` is the ERROR code to answer with when the refusing node is the
    message's ``to`` and the message is a unicast that is not itself a REPLY,
    ERROR or ACK. A relay only counts its refusals: an ERROR signed by the relay
    would not match at the origin, which accepts answers only from the ``to``
    of its request (the request times out instead). Broadcasts and duplicates
    are never answered.
    """

    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    STALE = "stale"
    HOP_LIMIT_EXHAUSTED = "hop_limit_exhausted"
    LOOP = "loop"
    BAD_PATH = "bad_path"
    RELAY_DENIED = "relay_denied"
    NO_ROUTE = "no_route"
    SEEN_CACHE_FULL = "seen_cache_full"
    DUPLICATE = "duplicate"

    @property
    def code(self) -> str | None:
        return _REFUSAL_CODES.get(self)


_REFUSAL_CODES: dict[RouteRefusal, str] = {
    RouteRefusal.BAD_SIGNATURE: "bad_signature",
    RouteRefusal.STALE: "bad_request",
    RouteRefusal.HOP_LIMIT_EXHAUSTED: "bad_request",
    RouteRefusal.LOOP: "bad_request",
    RouteRefusal.BAD_PATH: "bad_request",
    RouteRefusal.RELAY_DENIED: "policy_denied",
    RouteRefusal.NO_ROUTE: "bad_request",
    RouteRefusal.SEEN_CACHE_FULL: "busy",
}


# --- the Forward wrapper ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForwardEnvelope:
    """A parsed Forward: the hop-by-hop metadata and the origin's message bytes (not yet verified)."""

    hop_limit: int
    path: tuple[str, ...]
    message: bytes


def wrap_forward(message: bytes, hop_limit: int, path: Sequence[str]) -> bytes:
    """Forward bytes around the origin's signed ``message`` (kept byte for byte)."""
    if not 1 <= hop_limit <= U32:
        raise ConfigError(f"hop_limit must be in [1, 2**32 - 1], got {hop_limit}")
    if not 1 <= len(path) <= MAX_PATH:
        raise ConfigError(f"path holds 1 to {MAX_PATH} AgentIds, got {len(path)}")
    for hop in path:
        _local_agent_id(hop, "every path entry")
    fwd = Forward(hop_limit=hop_limit, path=list(path), message=message)
    return fwd.SerializeToString(deterministic=True)


def parse_forward(data: bytes) -> ForwardEnvelope:
    """Parse Forward bytes without verifying the inner message.

    Raises :class:`MessageFormatError` for bytes that are not one unambiguous
    Forward (a singular field twice, a wrong wire type) and
    :class:`BadForwardPath` for a path that is too long or holds a malformed id.
    """
    validate(data, FORWARD_SCHEMA)
    try:
        fwd = Forward.FromString(data)
    except DecodeError as exc:
        raise MessageFormatError(f"Forward does not parse: {exc}") from None
    path = tuple(fwd.path)
    if len(path) > MAX_PATH:
        raise BadForwardPath(f"path holds {len(path)} ids, above {MAX_PATH}")
    for hop in path:
        if not is_agent_id(hop):
            raise BadForwardPath(f"path holds a malformed AgentId {hop[:80]!r}")
    return ForwardEnvelope(fwd.hop_limit, path, fwd.message)


def _parse_inner(data: bytes) -> tuple[Message, bytes, bytes]:
    """The field-8 scan and the parse of the origin's message: ``(message, unsigned, signature)``."""
    unsigned, signature = excise_signature(data, MESSAGE_SCHEMA)
    try:
        msg = Message.FromString(data)
    except DecodeError as exc:
        raise MessageFormatError(f"Message does not parse: {exc}") from None
    return msg, unsigned, signature


def open_forward(data: bytes) -> tuple[ForwardEnvelope, Message]:
    """Parse a Forward and verify the origin's message inside (as :func:`iac.wire.message.open_message`)."""
    env = parse_forward(data)
    msg, unsigned, signature = _parse_inner(env.message)
    verify(sender_of(msg), Domain.MESSAGE, unsigned, signature)
    return env, msg


# --- policy and decisions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayPolicy:
    """What a node relays for others.

    Attributes:
        relay_broadcasts: flood broadcasts on (default True). A node always
            delivers a broadcast to its own handler; this only decides the re-flood.
        relay_unicast: relay unicast Forwards addressed to another node
            (default False: a node is not a relay unless configured as one).
        origins: relay only messages from these AgentIds (None: any).
        destinations: relay unicast only to these AgentIds (None: any).
        relay_replies: relay a REPLY, ERROR or ACK that answers a request this
            node relayed, whatever ``relay_unicast``/``origins``/``destinations`` say.
        max_hop_limit: clamp on the hop limit this node sends on.
    """

    relay_broadcasts: bool = True
    relay_unicast: bool = False
    origins: frozenset[str] | None = None
    destinations: frozenset[str] | None = None
    relay_replies: bool = True
    max_hop_limit: int = MAX_HOP_LIMIT

    def __post_init__(self) -> None:
        if not 1 <= self.max_hop_limit <= U32:
            raise ConfigError("max_hop_limit must be at least 1")
        for ids in (self.origins, self.destinations):
            for agent in ids or ():
                _local_agent_id(agent, "origins and destinations")

    def allows_broadcast(self, origin: str) -> bool:
        return self.relay_broadcasts and (self.origins is None or origin in self.origins)

    def allows_unicast(self, origin: str, to: str) -> bool:
        return (
            self.relay_unicast
            and (self.origins is None or origin in self.origins)
            and (self.destinations is None or to in self.destinations)
        )


@dataclass(frozen=True, slots=True)
class Send:
    """A FORWARD frame body to send to the connected peer ``peer``."""

    peer: str
    data: bytes


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """What to do with one received Forward.

    ``message`` (verified) is set when the node delivers it to its own handler
    (its ``to`` is this node, or it is a broadcast); ``message_bytes`` are the
    origin's bytes. ``sends`` are Forwards to pass on. ``refusal`` says why it
    was (partly) refused: for a broadcast that is delivered but not re-flooded
    (policy), ``message`` and ``refusal`` are both set. ``error`` is the typed
    error for a refusal (None for a duplicate).
    """

    message: Message | None = None
    message_bytes: bytes = b""
    sends: tuple[Send, ...] = ()
    refusal: RouteRefusal | None = None
    error: IacError | None = None
    origin: str = ""
    hop_limit: int = 0
    path: tuple[str, ...] = ()

    @property
    def deliver(self) -> bool:
        return self.message is not None


@dataclass(slots=True)
class RouterStats:
    delivered: int = 0
    forwarded: int = 0
    originated: int = 0
    duplicates: int = 0
    #: broadcasts delivered here whose hop limit ended the flood at this node
    flood_ends: int = 0
    refused: Counter[str] = field(default_factory=Counter)


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
        self.me = _local_agent_id(me, "me")
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

    # -- routes ---------------------------------------------------------------------------------

    def add_route(self, dest: str, next_hop: str, expires_us: int | None = None) -> None:
        """Reach ``dest`` through the peer ``next_hop`` (None: until replaced or removed)."""
        _local_agent_id(dest, "dest")
        _local_agent_id(next_hop, "next_hop")
        self._routes[dest] = (next_hop, expires_us)
        self._routes.move_to_end(dest)
        while len(self._routes) > self.max_routes:
            self._routes.popitem(last=False)

    def remove_route(self, dest: str) -> None:
        self._routes.pop(dest, None)

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
        msg, _, _ = _parse_inner(message)
        if msg.to:
            raise ConfigError("a broadcast has an empty `to`")
        if sender_of(msg) != self.me:
            raise ConfigError("a node originates only its own messages")
        key = ("b", self.me, msg.session_id, msg.msg_id)
        if not self._seen.add(key, now_us + self.retention_us, now_us):
            raise SeenCacheFull("the broadcast seen-cache is full")
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
        Raises :class:`NoRoute` when there is none.
        """
        msg, _, _ = _parse_inner(message)
        to = msg.to
        if not to:
            raise ConfigError("use originate_broadcast for a message with an empty `to`")
        if sender_of(msg) != self.me:
            raise ConfigError("a node originates only its own messages")
        hop = via if via is not None else self.next_hop(to, peers, now_us)
        if hop is None or hop not in peers:
            raise NoRoute(f"no connected peer or route toward {to[:16]}…")
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
        except MessageFormatError as exc:
            return self._refuse(RouteRefusal.MALFORMED, exc)
        except BadForwardPath as exc:
            return self._refuse(RouteRefusal.BAD_PATH, exc)
        try:
            msg, unsigned, signature = _parse_inner(env.message)
        except MessageFormatError as exc:
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
                RouteRefusal.HOP_LIMIT_EXHAUSTED, HopLimitExhausted("Forward arrived with hop_limit 0"), env
            )
        if self.me in env.path:
            return self._refuse(RouteRefusal.LOOP, RoutingLoop("this node is already in the path"), env)
        bad_path = self._check_path(env.path, origin, from_peer)
        if bad_path is not None:
            return self._refuse(RouteRefusal.BAD_PATH, BadForwardPath(bad_path), env)
        try:
            verify(origin, Domain.MESSAGE, unsigned, signature)
        except (BadSignature, InvalidAgentId) as exc:
            return self._refuse(RouteRefusal.BAD_SIGNATURE, exc, env)
        try:
            check_freshness(msg.timestamp, now_us, self.max_skew_us)
        except StaleMessage as exc:
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
        if not self._seen.add(key, now_us + self.retention_us, now_us):
            return self._refuse(RouteRefusal.SEEN_CACHE_FULL, SeenCacheFull("seen-cache is full"), env)
        self.stats.delivered += 1

        def delivered(sends: tuple[Send, ...] = (), refusal: RouteRefusal | None = None) -> RouteDecision:
            return RouteDecision(
                message=msg,
                message_bytes=env.message,
                sends=sends,
                refusal=refusal,
                error=RelayDenied("this node does not re-flood broadcasts from this origin")
                if refusal
                else None,
                origin=origin,
                hop_limit=env.hop_limit,
                path=env.path,
            )

        if not self.policy.allows_broadcast(origin):
            self.stats.refused[RouteRefusal.RELAY_DENIED] += 1
            return delivered(refusal=RouteRefusal.RELAY_DENIED)
        limit = min(env.hop_limit - 1, self.policy.max_hop_limit)
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
                RouteRefusal.RELAY_DENIED, RelayDenied("this node does not relay that message"), env
            )
        if to == self.me:
            if not self._seen.add(key, now_us + self.retention_us, now_us):
                return self._refuse(RouteRefusal.SEEN_CACHE_FULL, SeenCacheFull("seen-cache is full"), env)
            self._learn(origin, from_peer, now_us)
            self.stats.delivered += 1
            return RouteDecision(
                message=msg, message_bytes=env.message, origin=origin, hop_limit=env.hop_limit, path=env.path
            )
        limit = min(env.hop_limit - 1, self.policy.max_hop_limit)
        if limit < 1:
            return self._refuse(
                RouteRefusal.HOP_LIMIT_EXHAUSTED, HopLimitExhausted("no hop left to relay on"), env
            )
        hop = self.next_hop(to, peers, now_us)
        if hop is None or hop == from_peer or hop in env.path:
            return self._refuse(RouteRefusal.NO_ROUTE, NoRoute(f"no route toward {to[:16]}…"), env)
        if not self._seen.add(key, now_us + self.retention_us, now_us):
            return self._refuse(RouteRefusal.SEEN_CACHE_FULL, SeenCacheFull("seen-cache is full"), env)
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
        return RouteDecision(sends=(send,), origin=origin, hop_limit=env.hop_limit, path=env.path)

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

    def _refuse(
        self, refusal: RouteRefusal, error: IacError, env: ForwardEnvelope | None = None
    ) -> RouteDecision:
        self.stats.refused[refusal] += 1
        if env is None:
            return RouteDecision(refusal=refusal, error=error)
        return RouteDecision(refusal=refusal, error=error, hop_limit=env.hop_limit, path=env.path)

    def __repr__(self) -> str:
        return f"Router(me={self.me[:16]}…, seen={len(self._seen)}, routes={len(self._routes)})"


# --- test vectors -------------------------------------------------------------------------------

MESH_VECTORS_VERSION = 1
#: Fixed inputs of the vectors (seeds are 32 bytes: one repeated byte).
_SEEDS = {"origin": 0x11, "relay": 0x22, "receiver": 0x33}
_VECTOR_TIME_US = 1_700_000_000_000_000


def mesh_test_vectors() -> dict[str, Any]:
    """The deterministic content of ``proto/testvectors/mesh-v1.json`` (see docs/PROTOCOL.md)."""
    from iac.protocol import files as ft
    from iac.protocol.files.payloads import dumps_compact
    from iac.wire.identity import Identity
    from iac.wire.message import Session, build_message, sign_message

    ids = {role: Identity.from_seed(bytes([b]) * 32) for role, b in _SEEDS.items()}
    origin, relay, receiver = ids["origin"], ids["relay"], ids["receiver"]
    agents = {
        role: {"seed_hex": ident.seed().hex(), "agent_id": ident.agent_id} for role, ident in ids.items()
    }

    content = bytes(range(256)) * 8 + b"iac"  # 2051 bytes: two chunks of 1024 and one of 3
    chunk_size = 1024
    file_sha = hashlib.sha256(content).hexdigest()
    total = ft.chunk_count(len(content), chunk_size)
    chunks: list[dict[str, Any]] = []
    session = Session(session_id=0x0123456789ABCDEF)
    for index in range(total):
        data = content[index * chunk_size : (index + 1) * chunk_size]
        header = ft.ChunkHeader(
            "vector-transfer-1",
            "notes.txt",
            index,
            total,
            len(content),
            chunk_size,
            file_sha,
            hashlib.sha256(data).hexdigest(),
        )
        msg = build_message(
            sender=origin.agent_id,
            to=receiver.agent_id,
            msg_type=MessageType.FILE_TRANSFER,
            session=session,
            timestamp_us=_VECTOR_TIME_US + index,
            payload_json=header.to_json(),
            extra_data=data,
        )
        chunks.append(
            {
                "name": f"chunk {index}",
                "payload": json.loads(header.to_json()),
                "payload_json": header.to_json(),
                "extra_data_hex": data.hex(),
                "signed_hex": sign_message(origin, msg).hex(),
            }
        )
    acks = [
        ft.AckPayload("vector-transfer-1", ((0, 1),), ft.AckStatus.PARTIAL),
        ft.AckPayload("vector-transfer-1", ((0, 1), (2, 3)), ft.AckStatus.PARTIAL),
        ft.AckPayload("vector-transfer-1", ((0, 3),), ft.AckStatus.COMPLETE),
        ft.AckPayload(
            "vector-transfer-1",
            (),
            ft.AckStatus.FAILED,
            ft.FileHashMismatch.name,
            "'notes.txt': the received file does not match its sha256",
        ),
        ft.AckPayload("vector-transfer-2", (), ft.AckStatus.UNKNOWN),
    ]
    base = json.loads(chunks[0]["payload_json"])

    def neg(name: str, change: dict[str, Any], data: bytes, error: str, drop: str = "") -> dict[str, Any]:
        obj = {**base, **change}
        if drop:
            del obj[drop]
        return {
            "name": name,
            "payload_json": dumps_compact(obj),
            "extra_data_hex": data.hex(),
            "max_size": 1 << 20,
            "error": error,
        }

    first = content[:chunk_size]
    tampered = bytes([first[0] ^ 1]) + first[1:]
    chunk_negative = [
        neg("absolute path", {"name": "/etc/passwd"}, first, ft.UnsafeFileName.name),
        neg("parent directory", {"name": ".."}, first, ft.UnsafeFileName.name),
        neg("path separator", {"name": "../outside.txt"}, first, ft.UnsafeFileName.name),
        neg("backslash", {"name": "..\\outside.txt"}, first, ft.UnsafeFileName.name),
        neg("NUL in name", {"name": "a\u0000b"}, first, ft.UnsafeFileName.name),
        neg("hidden file", {"name": ".bashrc"}, first, ft.UnsafeFileName.name),
        neg("empty name", {"name": ""}, first, ft.UnsafeFileName.name),
        neg("name over 255 bytes", {"name": "é" * 128}, first, ft.UnsafeFileName.name),
        neg("size over max_size", {"size": (1 << 20) + 1, "total": 1025}, first, ft.FileTooLarge.name),
        neg("index not below total", {"index": 3}, first, ft.ChunkOutOfRange.name),
        neg("total inconsistent with size", {"total": 4}, first, ft.TransferMismatch.name),
        neg("chunk one byte short", {}, first[:-1], ft.BadChunkLength.name),
        neg("tampered chunk", {}, tampered, ft.ChunkHashMismatch.name),
        neg(
            "chunk_size below 1024", {"chunk_size": 512, "total": 5}, first[:512], ft.BadTransferPayload.name
        ),
        neg("index is a string", {"index": "0"}, first, ft.BadTransferPayload.name),
        neg("size is a float", {"size": 2051.0}, first, ft.BadTransferPayload.name),
        neg("sha256 uppercase", {"sha256": file_sha.upper()}, first, ft.BadTransferPayload.name),
        neg("transfer_id with a slash", {"transfer_id": "a/b"}, first, ft.BadTransferPayload.name),
        neg("no sha256", {}, first, ft.BadTransferPayload.name, drop="sha256"),
    ]

    bsession = Session(session_id=0xFEDCBA9876543210)
    bmsg = build_message(
        sender=origin.agent_id,
        to="",
        msg_type=MessageType.BROADCAST,
        session=bsession,
        timestamp_us=_VECTOR_TIME_US,
        payload_json='{"topic":"status","text":"hello, mesh"}',
    )
    bcast = sign_message(origin, bmsg)
    umsg = build_message(
        sender=origin.agent_id,
        to=receiver.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=_VECTOR_TIME_US,
        payload_json='{"fn":"echo","args":{"x":1}}',
    )
    unicast = sign_message(origin, umsg)
    altered = bytearray(unicast)
    altered[unicast.index(b'"x":1') + 4] ^= 0x01  # 1 -> 0
    o, r, c = origin.agent_id, relay.agent_id, receiver.agent_id

    def fwd(name: str, msg: bytes, hop_limit: int, path: list[str], desc: str) -> dict[str, Any]:
        return {
            "name": name,
            "description": desc,
            "hop_limit": hop_limit,
            "path": path,
            "message_hex": msg.hex(),
            "forward_hex": wrap_forward(msg, hop_limit, path).hex(),
        }

    forward = [
        fwd("broadcast, first hop", bcast, DEFAULT_BROADCAST_HOP_LIMIT, [o], "as the origin sends it"),
        fwd("broadcast, relayed once", bcast, DEFAULT_BROADCAST_HOP_LIMIT - 1, [o, r], "after one relay"),
        fwd("unicast via a relay, first hop", unicast, DEFAULT_HOP_LIMIT, [o], "origin to relay"),
        fwd("unicast via a relay, second hop", unicast, DEFAULT_HOP_LIMIT - 1, [o, r], "relay to receiver"),
    ]

    def fneg(name: str, body: bytes, from_peer: str, refusal: RouteRefusal, error: str) -> dict[str, Any]:
        return {
            "name": name,
            "receiver": "receiver",
            "from_peer": from_peer,
            "forward_hex": body.hex(),
            "refusal": refusal.value,
            "error": error,
        }

    forward_negative = [
        fneg(
            "hop_limit 0",
            Forward(hop_limit=0, path=[o, r], message=unicast).SerializeToString(deterministic=True),
            r,
            RouteRefusal.HOP_LIMIT_EXHAUSTED,
            HopLimitExhausted.name,
        ),
        fneg("loop", wrap_forward(unicast, 5, [o, c, r]), r, RouteRefusal.LOOP, RoutingLoop.name),
        fneg(
            "altered byte in the origin's message",
            wrap_forward(bytes(altered), 7, [o, r]),
            r,
            RouteRefusal.BAD_SIGNATURE,
            BadSignature.name,
        ),
        fneg(
            "path does not end with the neighbour",
            wrap_forward(unicast, 7, [o]),
            r,
            RouteRefusal.BAD_PATH,
            BadForwardPath.name,
        ),
        fneg(
            "path does not start with the origin",
            wrap_forward(unicast, 7, [r]),
            r,
            RouteRefusal.BAD_PATH,
            BadForwardPath.name,
        ),
        fneg(
            "uppercase AgentId in path",
            Forward(hop_limit=7, path=[o, r.upper()], message=unicast).SerializeToString(deterministic=True),
            r,
            RouteRefusal.BAD_PATH,
            BadForwardPath.name,
        ),
        fneg(
            "hop_limit twice",
            bytes.fromhex("0807") + wrap_forward(unicast, 7, [o, r]),
            r,
            RouteRefusal.MALFORMED,
            "field_repeated",
        ),
        fneg(
            "no message",
            Forward(hop_limit=7, path=[o, r]).SerializeToString(deterministic=True),
            r,
            RouteRefusal.MALFORMED,
            "signature_missing",
        ),
    ]
    return {
        "version": MESH_VECTORS_VERSION,
        "description": "IAC mesh payloads: FILE_TRANSFER chunks and acknowledgements, FORWARD wrappers",
        "time_us": _VECTOR_TIME_US,
        "max_skew_us": DEFAULT_MAX_SKEW_US,
        "agents": agents,
        "file_transfer": {
            "content_hex": content.hex(),
            "chunk_size": chunk_size,
            "chunks": chunks,
            "acks": [{"payload": json.loads(a.to_json()), "payload_json": a.to_json()} for a in acks],
            "query": {"payload_json": ft.StateQuery("vector-transfer-1").to_json()},
            "negative": chunk_negative,
        },
        "forward": forward,
        "forward_negative": forward_negative,
    }


def render_mesh_vectors() -> str:
    """``mesh_test_vectors()`` as the exact text of the committed file."""
    return json.dumps(mesh_test_vectors(), indent=1, ensure_ascii=False) + "\n"


def write_mesh_vectors(path: str | Path) -> None:
    """Rewrite the vector file (``python -c 'from iac.protocol.routing import write_mesh_vectors as w;
    w("proto/testvectors/mesh-v1.json")'``)."""
    Path(path).write_text(render_mesh_vectors(), encoding="utf-8")


__all__ = [
    "DEFAULT_BROADCAST_HOP_LIMIT",
    "DEFAULT_HOP_LIMIT",
    "FORWARD_SCHEMA",
    "MAX_HOP_LIMIT",
    "MAX_PATH",
    "BadForwardPath",
    "ForwardEnvelope",
    "HopLimitExhausted",
    "NoRoute",
    "RelayDenied",
    "RelayPolicy",
    "RouteDecision",
    "RouteRefusal",
    "Router",
    "RouterStats",
    "RoutingError",
    "RoutingLoop",
    "SeenCacheFull",
    "Send",
    "mesh_test_vectors",
    "open_forward",
    "parse_forward",
    "render_mesh_vectors",
    "wrap_forward",
    "write_mesh_vectors",
]
