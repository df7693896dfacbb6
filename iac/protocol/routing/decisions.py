"""What a router may relay (its policy) and what it decides about one Forward."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from iac.errors import REASONS, ConfigError, IacError
from iac.protocol.routing.forward import U32, require_agent_id
from iac.wire._pb.iac_pb2 import Message

#: The largest hop limit a node sends on (larger ones are clamped).
MAX_HOP_LIMIT = 64


class RouteRefusal(StrEnum):
    """Why :meth:`Router.on_forward` refused (a key of ``RouterStats.refused``).

    ``code`` is the ERROR code to answer with when the refusing node is the
    message's ``to`` and the message is a unicast that is not itself a REPLY,
    ERROR or ACK. A relay only counts its refusals: an ERROR signed by the relay
    would not match at the origin, which accepts answers only from the ``to``
    of its request (the request times out instead). Broadcasts and duplicates
    are never answered.
    """

    MALFORMED = "malformed_message"
    BAD_SIGNATURE = "bad_signature"
    STALE = "stale_message"
    HOP_LIMIT_EXHAUSTED = "hop_limit_exhausted"
    LOOP = "routing_loop"
    BAD_PATH = "bad_forward_path"
    RELAY_DENIED = "relay_denied"
    NO_ROUTE = "no_route"
    SEEN_CACHE_FULL = "seen_cache_full"
    DUPLICATE = "duplicate"
    RELAY_RATE = "relay_rate"  #: the origin's share of this relay is spent (``RelayPolicy.origin_rate``)

    @property
    def code(self) -> str | None:
        code = REASONS[self.value].error
        return None if code is None else code.value


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
        admit: relay unicast only when ``admit(origin, to)`` (None: anyone the fields above
            allow); a registry admits agents with a live record in it.
        origin_rate, origin_burst: unicast Forwards relayed per second for one origin, and the
            burst (None: no bound); beyond, ``relay_rate``.
        origin_bytes, origin_burst_bytes: the same in bytes (the relayed message's size).
        max_origins: origins whose share is tracked (the least recently seen is forgotten).
    """

    relay_broadcasts: bool = True
    relay_unicast: bool = False
    origins: frozenset[str] | None = None
    destinations: frozenset[str] | None = None
    relay_replies: bool = True
    max_hop_limit: int = MAX_HOP_LIMIT
    admit: Callable[[str, str], bool] | None = field(default=None, compare=False)
    origin_rate: float | None = None
    origin_burst: int = 100
    origin_bytes: float | None = None
    origin_burst_bytes: int = 4 * 1024 * 1024
    max_origins: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.max_hop_limit <= U32:
            raise ConfigError("max_hop_limit must be at least 1")
        for name in ("origin_rate", "origin_bytes"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{name} must be positive (or None)")
        if self.origin_burst < 1 or self.origin_burst_bytes < 1 or self.max_origins < 1:
            raise ConfigError("origin_burst, origin_burst_bytes and max_origins must be at least 1")
        for ids in (self.origins, self.destinations):
            for agent in ids or ():
                require_agent_id(agent, "origins and destinations")

    def allows_broadcast(self, origin: str) -> bool:
        return self.relay_broadcasts and (self.origins is None or origin in self.origins)

    def allows_unicast(self, origin: str, to: str) -> bool:
        return (
            self.relay_unicast
            and (self.origins is None or origin in self.origins)
            and (self.destinations is None or to in self.destinations)
            and (self.admit is None or self.admit(origin, to))
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
