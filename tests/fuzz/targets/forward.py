"""FORWARD: :func:`~iac.protocol.routing.parse_forward`, :func:`~iac.protocol.routing.open_forward`
and :meth:`Router.on_forward <iac.protocol.routing.Router.on_forward>` with fuzzed bodies.

Input: from the end, which test-vector agent the router is (0-2), which peer the bodies come from
(0-3: the three agents or a fourth connected one), whether the router relays unicast (0 or 1),
how many bodies (1-4) and the length of each (0-65535); the bodies from the front. One router
(small caches: 8 seen keys, 8 routes) takes every body in turn, at the vectors' time, with all
four agents connected.

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
from iac.wire.identity import Identity
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import FuzzedDataProvider, Layout, vectors

MAX_SEEN = MAX_ROUTES = 8


@dataclass(frozen=True)
class Plan:
    me: int
    sender: int
    relay_unicast: bool
    bodies: tuple[bytes, ...]


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    me = fdp.ConsumeIntInRange(0, 2)
    sender = fdp.ConsumeIntInRange(0, 3)
    relay_unicast = fdp.ConsumeIntInRange(0, 1) == 1
    count = fdp.ConsumeIntInRange(1, 4)
    bodies = tuple(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 65535)) for _ in range(count))
    return Plan(me, sender, relay_unicast, bodies)


def layout(plan: Plan) -> bytes:
    out = Layout().int(plan.me, 0, 2).int(plan.sender, 0, 3).int(int(plan.relay_unicast), 0, 1)
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
    router = Router(
        ids[plan.me],
        RelayPolicy(relay_unicast=plan.relay_unicast),
        max_seen=MAX_SEEN,
        max_routes=MAX_ROUTES,
    )
    now = vectors("mesh-v1")["time_us"]
    for body in plan.bodies:
        for fn in (parse_forward, open_forward):
            try:
                fn(body)
            except IacError as exc:
                check_error(exc)
        try:
            dec = router.on_forward(body, ids[plan.sender], set(ids), now)
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
        out[vec["name"]] = layout(Plan(me, sender, to_relay, (body,)))
        good.append(body)
    out["all-good-at-receiver"] = layout(Plan(2, 1, True, tuple(good[:4])))
    for vec in mesh["forward_negative"]:
        body = bytes.fromhex(vec["forward_hex"])
        me = ("origin", "relay", "receiver").index(vec["receiver"])
        out[vec["name"]] = layout(Plan(me, ids.index(vec["from_peer"]), False, (body,)))
    out["broadcast-full-path"] = layout(Plan(2, 1, False, (full_path_broadcast(),)))
    return out


def full_path_broadcast() -> bytes:
    """The vectors' first broadcast relayed along a path of :data:`MAX_PATH` ids: origin first, the
    relay last, made-up agents between."""
    first = vectors("mesh-v1")["forward"][0]
    ids = agents()
    between = [Identity.from_seed(bytes([0x80 + i]) * 32).agent_id for i in range(MAX_PATH - 2)]
    return wrap_forward(bytes.fromhex(first["message_hex"]), 16, [ids[0], *between, ids[1]])
