"""FORWARD: :func:`~iac.protocol.routing.parse_forward`, :func:`~iac.protocol.routing.open_forward`
and :meth:`Router.on_forward <iac.protocol.routing.Router.on_forward>` with fuzzed bodies.

Input: from the end, which test-vector agent the router is (0-2), which peer the bodies come from
(0-3: the three agents or a fourth one), the options (bits: :data:`RELAY_UNICAST`,
:data:`NO_FLOOD`, :data:`RECEIVER_AWAY`, :data:`LATE`), how many bodies (1-4) and the length of
each (0-65535); the bodies from the front. One router, with small caches (:data:`MAX_SEEN` keys,
:data:`MAX_ROUTES` routes) and, unless it is the receiver, a static route to the vectors'
receiver through the fourth agent, takes every body in turn, at the vectors' time, with all four
agents connected (or all but the receiver).

Checked besides the bounds: ``on_forward`` never raises (it answers with a decision, refusals
included); its caches stay within their bounds; a refusal carries a typed error of the peer's
fault; and every Forward it sends on parses, with a hop limit of at least 1 and a path that ends
with the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from iac.errors import IacError
from iac.protocol.routing import (
    MAX_PATH,
    RelayPolicy,
    RouteDecision,
    Router,
    open_forward,
    parse_forward,
    wrap_forward,
)
from iac.wire._pb.iac_pb2 import Message
from iac.wire.identity import Identity
from iac.wire.message import sign_message
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import FuzzedDataProvider, Layout, vectors

MAX_SEEN = MAX_ROUTES = 2
#: Options: relay unicast; do not re-flood broadcasts; the receiver is not connected (reached by
#: the route); the clock is 61 s late, past the vectors' freshness.
RELAY_UNICAST, NO_FLOOD, RECEIVER_AWAY, LATE = 1, 2, 4, 8


@dataclass(frozen=True)
class Plan:
    me: int
    sender: int
    options: int
    bodies: tuple[bytes, ...]


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    me = fdp.ConsumeIntInRange(0, 2)
    sender = fdp.ConsumeIntInRange(0, 3)
    options = fdp.ConsumeIntInRange(0, 15)
    count = fdp.ConsumeIntInRange(1, 4)
    bodies = tuple(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 65535)) for _ in range(count))
    return Plan(me, sender, options, bodies)


def layout(plan: Plan) -> bytes:
    out = Layout().int(plan.me, 0, 2).int(plan.sender, 0, 3).int(plan.options, 0, 15)
    out.int(len(plan.bodies), 1, 4)
    for body in plan.bodies:
        out.int(len(body), 0, 65535).bytes(body)
    return out.build()


@cache
def agents() -> tuple[str, ...]:
    """The vectors' origin, relay and receiver, and a fourth agent."""
    mesh = vectors("mesh-v1")["agents"]
    return (*(mesh[role]["agent_id"] for role in ("origin", "relay", "receiver")), fourth())


@cache
def fourth() -> str:
    return Identity.from_seed(b"\x44" * 32).agent_id


def check_decision(router: Router, dec: RouteDecision) -> None:
    if dec.error is not None:
        check_error(dec.error)
    if dec.refusal is not None and dec.error is None and dec.refusal != "duplicate":
        raise Finding(f"refusal {dec.refusal} without an error")
    for send in dec.sends:
        env = parse_forward(send.data)
        if env.hop_limit < 1 or env.path[-1] != router.me or len(env.path) > MAX_PATH:
            raise Finding(
                f"the router sends on a Forward with hop_limit {env.hop_limit}, path {len(env.path)}"
            )
    if len(router._seen) > MAX_SEEN or router.route_count > MAX_ROUTES:
        raise Finding("the router's caches outgrew their bounds")
    if len(router._relayed_requests) > MAX_ROUTES:
        raise Finding("the router remembers more relayed requests than max_routes")


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    ids = agents()
    opts = plan.options
    policy = RelayPolicy(relay_unicast=bool(opts & RELAY_UNICAST), relay_broadcasts=not opts & NO_FLOOD)
    router = Router(ids[plan.me], policy, max_seen=MAX_SEEN, max_routes=MAX_ROUTES)
    if plan.me != 2:
        router.add_route(ids[2], ids[3])
    peers = set(ids) - {ids[2]} if opts & RECEIVER_AWAY else set(ids)
    now = vectors("mesh-v1")["time_us"] + (61_000_000 if opts & LATE else 0)
    for body in plan.bodies:
        for fn in (parse_forward, open_forward):
            try:
                fn(body)
            except IacError as exc:
                check_error(exc)
        try:
            dec = router.on_forward(body, ids[plan.sender], peers, now)
        except Exception as exc:
            raise Finding(f"Router.on_forward raised {type(exc).__name__}: {exc}") from exc
        check_decision(router, dec)


def seeds() -> dict[str, bytes]:
    """The FORWARD vectors, good and bad, each at the agent that receives it; all of the good ones
    through one router; and a broadcast whose path is as long as a path may be."""
    mesh = vectors("mesh-v1")
    ids = agents()
    out: dict[str, bytes] = {}
    good: list[bytes] = []
    for vec in mesh["forward"]:
        body = bytes.fromhex(vec["forward_hex"])
        sender = ids.index(vec["path"][-1])
        to_relay = "first hop" in vec["name"] and "unicast" in vec["name"]
        me = 1 if to_relay else 2
        out[vec["name"]] = layout(Plan(me, sender, RELAY_UNICAST if to_relay else 0, (body,)))
        good.append(body)
        if to_relay:
            routed = Plan(me, sender, RELAY_UNICAST | RECEIVER_AWAY, (body,))
            out[f"{vec['name']}, by the route"] = layout(routed)
        out[f"{vec['name']}, late"] = layout(
            Plan(me, sender, LATE | (RELAY_UNICAST if to_relay else 0), (body,))
        )
    out["all-good-at-receiver"] = layout(Plan(2, 1, RELAY_UNICAST, tuple(good[:4])))
    out["broadcast, not re-flooded"] = layout(Plan(2, 0, NO_FLOOD, (good[0],)))
    for vec in mesh["forward_negative"]:
        body = bytes.fromhex(vec["forward_hex"])
        me = ("origin", "relay", "receiver").index(vec["receiver"])
        out[vec["name"]] = layout(Plan(me, ids.index(vec["from_peer"]), 0, (body,)))
    out["broadcast-full-path"] = layout(Plan(2, 1, 0, (full_path_broadcast(),)))
    out["seen-cache-full"] = layout(Plan(2, 1, 0, tuple(fresh_broadcasts(MAX_SEEN + 1))))
    return out


def fresh_broadcasts(n: int) -> list[bytes]:
    """``n`` broadcasts of the vectors' origin (its first broadcast with other msg_ids, signed
    again), each relayed once."""
    mesh = vectors("mesh-v1")
    origin = Identity.from_seed(bytes.fromhex(mesh["agents"]["origin"]["seed_hex"]))
    ids = agents()
    out = []
    for i in range(n):
        msg = Message.FromString(bytes.fromhex(mesh["forward"][0]["message_hex"]))
        msg.msg_id += 1000 + i
        out.append(wrap_forward(sign_message(origin, msg), 8, [ids[0], ids[1]]))
    return out


def full_path_broadcast() -> bytes:
    """The vectors' first broadcast relayed along a path of :data:`MAX_PATH` ids: origin first, the
    relay last, made-up agents between."""
    first = vectors("mesh-v1")["forward"][0]
    ids = agents()
    between = [Identity.from_seed(bytes([0x80 + i]) * 32).agent_id for i in range(MAX_PATH - 2)]
    return wrap_forward(bytes.fromhex(first["message_hex"]), 16, [ids[0], *between, ids[1]])
