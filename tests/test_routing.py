"""Sans-IO broadcast and relay routing: graphs of Router objects wired in memory with an explicit clock."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from iac.errors import REASONS, ConfigError, MessageRejected, ProtocolError
from iac.protocol.routing import (
    DEFAULT_BROADCAST_HOP_LIMIT,
    RelayPolicy,
    RouteDecision,
    Router,
    RouteRefusal,
    RoutingError,
    Send,
    open_forward,
    parse_forward,
    wrap_forward,
)
from iac.wire._pb.iac_pb2 import Forward, Message, MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sender_of, sign_message
from tools.vectors import points
from tools.vectors.mesh import render_mesh_vectors

ROOT = Path(__file__).resolve().parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "mesh-v1.json"
NOW = 1_700_000_000_000_000
IDS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(20)]

Key = tuple[str, int, int]


def key_of(msg: Message) -> Key:
    return (sender_of(msg), msg.session_id, msg.msg_id)


class Mesh:
    """Routers on a graph; Forwards travel through a queue, delivered in a seeded random order."""

    def __init__(
        self, n: int, edges: Iterable[tuple[int, int]], policies: dict[int, RelayPolicy] | None = None
    ) -> None:
        self.ids = [ident.agent_id for ident in IDS[:n]]
        self.idents = {ident.agent_id: ident for ident in IDS[:n]}
        self.routers = {
            a: Router(a, (policies or {}).get(i, RelayPolicy(relay_unicast=True)))
            for i, a in enumerate(self.ids)
        }
        self.adj: dict[str, set[str]] = {a: set() for a in self.ids}
        for i, j in edges:
            self.adj[self.ids[i]].add(self.ids[j])
            self.adj[self.ids[j]].add(self.ids[i])
        self.queue: list[tuple[str, str, bytes]] = []  # (to, from, Forward bytes)
        self.rng = random.Random(99)
        self.delivered: Counter[tuple[str, Key]] = Counter()
        self.inbox: dict[str, list[Message]] = {a: [] for a in self.ids}
        self.forwarded: Counter[tuple[str, Key]] = Counter()
        self.decisions: list[tuple[str, RouteDecision]] = []
        self.sessions = {a: Session(session_id=i + 1) for i, a in enumerate(self.ids)}
        self.tamper: dict[tuple[str, str], int] = {}  # (from, to) -> byte offset to flip in the inner message

    def send_all(self, sender: str, sends: Iterable[Send]) -> None:
        for s in sends:
            assert s.peer in self.adj[sender], "a Forward to a peer that is not connected"
            data = s.data
            flip = self.tamper.get((sender, s.peer))
            if flip is not None:
                env = parse_forward(data)
                inner = bytearray(env.message)
                inner[flip] ^= 0x01
                data = wrap_forward(bytes(inner), env.hop_limit, env.path)
            self.queue.append((s.peer, sender, data))

    def run(self) -> None:
        while self.queue:
            to, frm, data = self.queue.pop(self.rng.randrange(len(self.queue)))
            d = self.routers[to].on_forward(data, frm, self.adj[to], NOW)
            self.decisions.append((to, d))
            if d.message is not None:
                self.delivered[to, key_of(d.message)] += 1
                self.inbox[to].append(d.message)
            if d.sends:
                env = parse_forward(data)
                self.forwarded[to, key_of(Message.FromString(env.message))] += 1
            self.send_all(to, d.sends)

    def message(self, origin: str, to: str = "", msg_type: int = MessageType.BROADCAST, **kw: Any) -> bytes:
        msg = build_message(
            sender=origin,
            to=to,
            msg_type=msg_type,
            session=self.sessions[origin],
            timestamp_us=kw.pop("timestamp_us", NOW),
            payload_json=kw.pop("payload_json", '{"n":1}'),
            **kw,
        )
        return sign_message(self.idents[origin], msg)

    def broadcast(self, origin: str, hop_limit: int | None = None) -> Key:
        data = self.message(origin)
        self.send_all(
            origin, self.routers[origin].originate_broadcast(data, self.adj[origin], NOW, hop_limit)
        )
        self.run()
        return key_of(Message.FromString(data))

    def refusals(self, node: str) -> Counter[str]:
        return self.routers[node].stats.refused


def ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def random_connected(n: int, extra: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}  # a random spanning tree
    while len(edges) < n - 1 + extra:
        a, b = sorted(rng.sample(range(n), 2))
        edges.add((a, b))
    return sorted(edges)


def line(n: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(n - 1)]


# --- broadcast ----------------------------------------------------------------------------------


@pytest.mark.parametrize("graph", ["ring", "random"])
def test_100_broadcasts_reach_each_of_20_nodes_exactly_once(graph: str) -> None:
    edges = ring(20) if graph == "ring" else random_connected(20, extra=12, seed=2024)
    mesh = Mesh(20, edges)
    rng = random.Random(5)
    keys = [mesh.broadcast(mesh.ids[rng.randrange(20)]) for _ in range(100)]
    assert len(set(keys)) == 100
    for key in keys:
        origin = key[0]
        for node in mesh.ids:
            assert mesh.delivered[node, key] == (0 if node == origin else 1), (node, key)
            assert mesh.forwarded[node, key] <= 1
    assert sum(mesh.delivered.values()) == 100 * 19
    for node in mesh.ids:
        refused = mesh.refusals(node)
        assert set(refused) <= {RouteRefusal.DUPLICATE}, refused
    dup = sum(mesh.refusals(a)[RouteRefusal.DUPLICATE] for a in mesh.ids)
    if graph == "ring":  # the two directions meet once per broadcast (twice when the ring is even)
        assert 100 <= dup <= 200


def test_delivered_broadcast_verifies_as_the_origin() -> None:
    mesh = Mesh(4, line(4))
    mesh.broadcast(mesh.ids[0])
    (to, d) = mesh.decisions[-1]
    assert to == mesh.ids[3] and d.message is not None
    assert d.path == tuple(mesh.ids[:3]) and d.hop_limit == DEFAULT_BROADCAST_HOP_LIMIT - 2
    assert sender_of(open_message(d.message_bytes)) == mesh.ids[0]


def test_broadcast_hop_limit_bounds_the_flood() -> None:
    mesh = Mesh(6, line(6))
    key = mesh.broadcast(mesh.ids[0], hop_limit=2)
    got = [mesh.delivered[a, key] for a in mesh.ids]
    assert got == [0, 1, 1, 0, 0, 0]
    assert mesh.routers[mesh.ids[2]].stats.flood_ends == 1
    # a policy's max_hop_limit clamps what a relay sends on
    mesh = Mesh(6, line(6), {1: RelayPolicy(max_hop_limit=1)})
    key = mesh.broadcast(mesh.ids[0])
    assert [mesh.delivered[a, key] for a in mesh.ids] == [0, 1, 1, 0, 0, 0]


def test_relay_policy_can_stop_reflooding_but_the_node_still_delivers() -> None:
    mesh = Mesh(4, line(4), {1: RelayPolicy(relay_broadcasts=False)})
    key = mesh.broadcast(mesh.ids[0])
    assert [mesh.delivered[a, key] for a in mesh.ids] == [0, 1, 0, 0]
    assert mesh.refusals(mesh.ids[1])[RouteRefusal.RELAY_DENIED] == 1
    d = next(d for to, d in mesh.decisions if to == mesh.ids[1])
    assert d.deliver and d.error.reason == "relay_denied" and d.sends == ()


def test_altered_broadcast_is_caught_and_the_genuine_copy_still_arrives() -> None:
    # square 0-1-3, 0-2-3: node 1 alters what it relays to 3; 3 still gets 0's broadcast through 2.
    mesh = Mesh(4, [(0, 1), (1, 3), (0, 2), (2, 3)])
    a, b, _, d = mesh.ids
    mesh.tamper[b, d] = 150
    key = mesh.broadcast(a)
    assert mesh.delivered[d, key] == 1
    bad = [dec for to, dec in mesh.decisions if to == d and dec.refusal is RouteRefusal.BAD_SIGNATURE]
    duplicate = [dec for to, dec in mesh.decisions if to == d and dec.refusal is RouteRefusal.DUPLICATE]
    # the altered copy is refused if it came first, dropped as a duplicate if it came second
    assert len(bad) + len(duplicate) == 1
    if bad:
        assert bad[0].error.reason == "bad_signature"


def test_seen_cache_is_bounded_and_expires() -> None:
    a, b = IDS[0], IDS[1]
    router = Router(b.agent_id, max_seen=2, max_skew_us=1_000_000)
    session = Session(session_id=9)

    def bcast(t: int) -> bytes:
        m = build_message(
            sender=a.agent_id, to="", msg_type=MessageType.BROADCAST, session=session, timestamp_us=t
        )
        return wrap_forward(sign_message(a, m), 3, [a.agent_id])

    peers = {a.agent_id}
    assert router.on_forward(bcast(NOW), a.agent_id, peers, NOW).deliver
    assert router.on_forward(bcast(NOW), a.agent_id, peers, NOW).deliver
    full = router.on_forward(bcast(NOW), a.agent_id, peers, NOW)
    assert full.refusal is RouteRefusal.SEEN_CACHE_FULL and not full.deliver
    later = NOW + 2_000_001
    assert router.on_forward(bcast(later), a.agent_id, peers, later).deliver
    stale = router.on_forward(bcast(NOW), a.agent_id, peers, later)
    assert stale.refusal is RouteRefusal.STALE


# --- unicast relaying ---------------------------------------------------------------------------


def test_relayed_unicast_verifies_the_origin_and_the_reply_routes_back() -> None:
    # A - B - C: A cannot reach C; B relays only A -> C. C answers; the reply goes back through B.
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    mesh.routers[b].policy = RelayPolicy(
        relay_unicast=True, origins=frozenset({a}), destinations=frozenset({c})
    )
    mesh.routers[a].add_route(c, b)
    request = mesh.message(a, c, MessageType.COMMAND, payload_json='{"fn":"echo"}')
    mesh.send_all(a, [mesh.routers[a].originate(request, mesh.adj[a], NOW)])
    mesh.run()
    [got] = mesh.inbox[c]
    assert sender_of(got) == a and got.payload_json == '{"fn":"echo"}'
    assert mesh.routers[c].next_hop(a, mesh.adj[c], NOW) == b  # learned from the request

    reply = mesh.message(c, a, MessageType.REPLY, reply_to=got.msg_id, reply_session_id=got.session_id)
    mesh.send_all(c, [mesh.routers[c].originate(reply, mesh.adj[c], NOW)])
    mesh.run()
    [answer] = mesh.inbox[a]
    assert sender_of(answer) == c and answer.msg_type == MessageType.REPLY
    assert (answer.reply_session_id, answer.reply_to) == (got.session_id, got.msg_id)
    d = next(d for to, d in mesh.decisions if to == a)
    assert d.path == (c, b)

    # a message from C to A that answers nothing is not relayed under B's policy
    unsolicited = mesh.message(c, a, MessageType.COMMAND)
    mesh.send_all(c, [mesh.routers[c].originate(unsolicited, mesh.adj[c], NOW)])
    mesh.run()
    assert len(mesh.inbox[a]) == 1
    assert mesh.refusals(b)[RouteRefusal.RELAY_DENIED] == 1
    # nor is a reply that names a request B never relayed
    forged = mesh.message(c, a, MessageType.REPLY, reply_to=12345, reply_session_id=got.session_id)
    mesh.send_all(c, [mesh.routers[c].originate(forged, mesh.adj[c], NOW)])
    mesh.run()
    assert mesh.refusals(b)[RouteRefusal.RELAY_DENIED] == 2


def test_relay_policy_denial_is_counted_and_typed() -> None:
    mesh = Mesh(3, line(3), {1: RelayPolicy()})  # the default: broadcasts only
    a, b, c = mesh.ids
    mesh.send_all(
        a, [mesh.routers[a].originate(mesh.message(a, c, MessageType.COMMAND), mesh.adj[a], NOW, via=b)]
    )
    mesh.run()
    assert mesh.inbox[c] == []
    assert mesh.refusals(b) == Counter({RouteRefusal.RELAY_DENIED: 1})
    [(_, d)] = mesh.decisions
    assert d.error.reason == "relay_denied" and d.refusal is not None and d.refusal.code == "policy_denied"


def test_unicast_hop_limit() -> None:
    mesh = Mesh(4, line(4))
    a, b, c, d = mesh.ids
    mesh.routers[b].add_route(d, c)
    sends = [
        mesh.routers[a].originate(
            mesh.message(a, d, MessageType.COMMAND), mesh.adj[a], NOW, via=b, hop_limit=2
        )
    ]
    mesh.send_all(a, sends)
    mesh.run()
    assert mesh.inbox[d] == []
    assert mesh.refusals(c)[RouteRefusal.HOP_LIMIT_EXHAUSTED] == 1
    assert mesh.decisions[-1][1].error.reason == "hop_limit_exhausted"
    sends = [
        mesh.routers[a].originate(
            mesh.message(a, d, MessageType.COMMAND), mesh.adj[a], NOW, via=b, hop_limit=3
        )
    ]
    mesh.send_all(a, sends)
    mesh.run()
    assert len(mesh.inbox[d]) == 1


def test_hop_limit_zero_and_loops_are_refused() -> None:
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    msg = mesh.message(a, c, MessageType.COMMAND)
    zero = Forward(hop_limit=0, path=[a], message=msg).SerializeToString()
    d = mesh.routers[b].on_forward(zero, a, {a, c}, NOW)
    assert d.refusal is RouteRefusal.HOP_LIMIT_EXHAUSTED and d.error.reason == "hop_limit_exhausted"
    looped = wrap_forward(msg, 5, [a, b, c])
    d = mesh.routers[b].on_forward(looped, c, {a, c}, NOW)
    assert d.refusal is RouteRefusal.LOOP and d.error.reason == "routing_loop"
    assert mesh.refusals(b) == Counter({RouteRefusal.HOP_LIMIT_EXHAUSTED: 1, RouteRefusal.LOOP: 1})


def test_route_table_loop_is_not_followed() -> None:
    # B and C each think the other leads to D: the Forward would bounce; it is refused instead.
    mesh = Mesh(4, [(0, 1), (1, 2)])
    a, b, c, d = mesh.ids
    mesh.routers[b].add_route(d, c)
    mesh.routers[c].add_route(d, b)
    mesh.send_all(
        a, [mesh.routers[a].originate(mesh.message(a, d, MessageType.COMMAND), mesh.adj[a], NOW, via=b)]
    )
    mesh.run()
    assert mesh.refusals(c)[RouteRefusal.NO_ROUTE] == 1
    assert len(mesh.decisions) == 2


def test_altered_byte_in_relayed_unicast_is_caught() -> None:
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    request = mesh.message(a, c, MessageType.COMMAND, payload_json='{"amount":100}')
    offset = request.index(b"100")
    mesh.tamper[b, c] = offset
    mesh.send_all(a, [mesh.routers[a].originate(request, mesh.adj[a], NOW, via=b)])
    mesh.run()
    assert mesh.inbox[c] == []
    [(_, d)] = [(to, d) for to, d in mesh.decisions if to == c]
    assert d.refusal is RouteRefusal.BAD_SIGNATURE and d.error.reason == "bad_signature"
    with pytest.raises(MessageRejected) as exc_info:
        open_forward(wrap_forward(request[:offset] + b"0" + request[offset + 1 :], 3, [a]))
    assert exc_info.value.reason == "bad_signature"


def test_exact_copies_are_relayed_once_but_retransmissions_pass() -> None:
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    msg = build_message(
        sender=a,
        to=c,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=77),
        msg_id=5,
        timestamp_us=NOW,
    )
    first = mesh.routers[a].originate(sign_message(mesh.idents[a], msg), mesh.adj[a], NOW, via=b)
    mesh.send_all(a, [first, first])
    mesh.run()
    assert len(mesh.inbox[c]) == 1
    assert mesh.refusals(b)[RouteRefusal.DUPLICATE] == 1
    msg.timestamp = NOW + 1000  # the same ids, signed again with a fresh timestamp
    again = mesh.routers[a].originate(sign_message(mesh.idents[a], msg), mesh.adj[a], NOW, via=b)
    mesh.send_all(a, [again])
    mesh.run()
    assert len(mesh.inbox[c]) == 2  # the node's replay guard re-answers it


def test_bad_paths() -> None:
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    msg = mesh.message(a, b, MessageType.COMMAND)
    r = mesh.routers[b]
    assert r.on_forward(wrap_forward(msg, 3, [c]), c, {a, c}, NOW).refusal is RouteRefusal.BAD_PATH
    assert r.on_forward(wrap_forward(msg, 3, [a]), c, {a, c}, NOW).refusal is RouteRefusal.BAD_PATH
    assert r.on_forward(wrap_forward(msg, 3, [a, c, a, c]), c, {a, c}, NOW).refusal is RouteRefusal.BAD_PATH
    too_long = Forward(hop_limit=3, path=[a] * 65, message=msg).SerializeToString()
    d = r.on_forward(too_long, a, {a, c}, NOW)
    assert d.refusal is RouteRefusal.BAD_PATH and d.error.reason == "bad_forward_path"
    assert r.on_forward(b"\x08\x01\x08\x02", a, {a}, NOW).refusal is RouteRefusal.MALFORMED
    assert r.on_forward(wrap_forward(msg, 3, [a]), a, {a, c}, NOW).deliver


def test_a_key_that_is_not_an_agent_id_is_refused_in_a_forward_path() -> None:
    a, b, c = (i.agent_id for i in IDS[:3])
    msg = sign_message(
        IDS[0],
        build_message(sender=a, to=c, msg_type=MessageType.COMMAND, session=Session(), timestamp_us=NOW),
    )
    for bad in (points.encode(points.ORDER_8).hex(), points.mixed_order(b), points.non_canonical(3).hex()):
        with pytest.raises(ConfigError):
            wrap_forward(msg, 3, [a, bad, b])
        data = Forward(hop_limit=3, path=[a, bad, b], message=msg).SerializeToString()
        with pytest.raises(RoutingError) as exc_info:
            parse_forward(data)
        assert exc_info.value.reason == "bad_forward_path"
        d = Router(c, RelayPolicy()).on_forward(data, b, {b}, NOW)
        assert d.refusal is RouteRefusal.BAD_PATH and d.error.reason == "bad_forward_path"


def test_originate_without_a_route_raises() -> None:
    mesh = Mesh(3, line(3))
    a, _, c = mesh.ids
    with pytest.raises(RoutingError) as exc_info:
        mesh.routers[a].originate(mesh.message(a, c, MessageType.COMMAND), mesh.adj[a], NOW)
    assert exc_info.value.reason == "no_route"
    with pytest.raises(ConfigError):
        mesh.routers[a].originate(mesh.message(a), mesh.adj[a], NOW)
    with pytest.raises(ConfigError):
        wrap_forward(b"", 0, [a])
    with pytest.raises(ConfigError):
        RelayPolicy(origins=frozenset({"nope"}))


def test_learned_routes_expire_and_static_routes_win() -> None:
    mesh = Mesh(3, line(3))
    a, b, c = mesh.ids
    mesh.send_all(
        a, [mesh.routers[a].originate(mesh.message(a, c, MessageType.COMMAND), mesh.adj[a], NOW, via=b)]
    )
    mesh.run()
    rc = mesh.routers[c]
    assert rc.next_hop(a, {b}, NOW) == b
    assert rc.expire(NOW + rc.retention_us + 1) >= 1
    assert rc.next_hop(a, {b}, NOW + rc.retention_us + 1) is None
    rc.add_route(a, b)  # static
    assert rc.next_hop(a, {b}, NOW + 10**12) == b


# --- vectors ------------------------------------------------------------------------------------


def test_mesh_vector_file_is_up_to_date() -> None:
    assert VECTOR_FILE.read_text("utf-8") == render_mesh_vectors(), (
        "proto/testvectors/mesh-v1.json is stale; rewrite it with `python -m tools.vectors.mesh`"
    )


VECTORS: dict[str, Any] = json.loads(VECTOR_FILE.read_text("utf-8"))


@pytest.mark.parametrize("vector", VECTORS["forward"], ids=lambda v: v["name"])
def test_forward_vectors(vector: dict[str, Any]) -> None:
    message = bytes.fromhex(vector["message_hex"])
    body = bytes.fromhex(vector["forward_hex"])
    assert wrap_forward(message, vector["hop_limit"], vector["path"]) == body
    env, msg = open_forward(body)
    assert env.hop_limit == vector["hop_limit"] and list(env.path) == vector["path"]
    assert env.message == message and sender_of(msg) == VECTORS["agents"]["origin"]["agent_id"]
    # the receiver (or the relay, for a broadcast or the first hop) accepts it
    agents = {role: v["agent_id"] for role, v in VECTORS["agents"].items()}
    me = agents["receiver"] if agents["relay"] in vector["path"] or not msg.to else agents["relay"]
    router = Router(me, RelayPolicy(relay_unicast=True), max_skew_us=VECTORS["max_skew_us"])
    peers = {agents["relay"], agents["receiver"]}
    d = router.on_forward(body, vector["path"][-1], peers, VECTORS["time_us"])
    assert d.refusal is None, d.error


@pytest.mark.parametrize("vector", VECTORS["forward_negative"], ids=lambda v: v["name"])
def test_forward_negative_vectors(vector: dict[str, Any]) -> None:
    me = VECTORS["agents"][vector["receiver"]]["agent_id"]
    router = Router(me, RelayPolicy(relay_unicast=True), max_skew_us=VECTORS["max_skew_us"])
    d = router.on_forward(
        bytes.fromhex(vector["forward_hex"]), vector["from_peer"], {vector["from_peer"]}, VECTORS["time_us"]
    )
    assert d.refusal is not None and d.refusal.value == vector["refusal"]
    assert d.error is not None and d.error.reason == vector["error"]
    assert router.stats.refused[d.refusal] == 1
    assert REASONS[d.error.reason].counter == d.refusal  # counted under its reason, or its family


def test_file_transfer_vector_messages_verify() -> None:
    origin = VECTORS["agents"]["origin"]["agent_id"]
    for chunk in VECTORS["file_transfer"]["chunks"]:
        msg = open_message(bytes.fromhex(chunk["signed_hex"]))
        assert sender_of(msg) == origin and msg.msg_type == MessageType.FILE_TRANSFER
        assert msg.payload_json == chunk["payload_json"] and msg.extra_data.hex() == chunk["extra_data_hex"]


def test_malformed_forward_raises_format_error() -> None:
    with pytest.raises(ProtocolError) as exc_info:
        parse_forward(b"\x1a\x05abc")
    assert exc_info.value.reason == "malformed_message"
