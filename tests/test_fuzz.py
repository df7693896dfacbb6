"""Regression tests for what the fuzz targets found."""

from __future__ import annotations

import json
from pathlib import Path

from iac.protocol.routing import MAX_PATH, RelayPolicy, Router, RouteRefusal, parse_forward, wrap_forward
from iac.wire.identity import Identity

ROOT = Path(__file__).resolve().parent.parent


def test_router_does_not_relay_a_forward_whose_path_is_full() -> None:
    """A neighbour could send a broadcast (or a unicast to relay) whose path already holds MAX_PATH
    ids: ``on_forward`` raised ConfigError from ``wrap_forward`` instead of answering with a decision.
    Found by the ``forward`` target (tests/fuzz/corpus/forward/seed-broadcast-full-path)."""
    mesh = json.loads((ROOT / "proto" / "testvectors" / "mesh-v1.json").read_text(encoding="utf-8"))
    origin, relay, receiver = (mesh["agents"][role]["agent_id"] for role in ("origin", "relay", "receiver"))
    other = Identity.from_seed(b"\x44" * 32).agent_id
    peers = {origin, relay, receiver, other}
    between = [Identity.from_seed(bytes([0x80 + i]) * 32).agent_id for i in range(MAX_PATH - 2)]
    now = mesh["time_us"]

    broadcast = bytes.fromhex(mesh["forward"][0]["message_hex"])
    full = wrap_forward(broadcast, 16, [origin, *between, relay])
    router = Router(receiver)
    dec = router.on_forward(full, relay, peers, now)
    assert dec.deliver and dec.sends == () and dec.refusal is None
    assert router.stats.flood_ends == 1

    unicast = bytes.fromhex(mesh["forward"][2]["message_hex"])  # origin -> receiver
    dec = Router(relay, RelayPolicy(relay_unicast=True)).on_forward(
        wrap_forward(unicast, 8, [origin, *between, other]), other, peers, now
    )
    assert dec.refusal is RouteRefusal.HOP_LIMIT_EXHAUSTED and dec.sends == ()

    # One id short of full: relayed once more, with no hop left after that.
    dec = Router(relay, RelayPolicy(relay_unicast=True)).on_forward(
        wrap_forward(unicast, 8, [origin, *between[1:], other]), other, peers, now
    )
    assert [(len(parse_forward(s.data).path), parse_forward(s.data).hop_limit) for s in dec.sends] == [
        (MAX_PATH, 1)
    ]
