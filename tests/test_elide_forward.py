"""Compact Forwards (capability elide-forward/1): the sans-IO rule, its vectors, the checks on
what a receiver restores, and relaying through a real node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TRANSPORT_PARAMS, listen_url, run

from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.routing import RelayPolicy, RouteDecision, Router, parse_forward, wrap_forward
from iac.testing import DOWN, UnixTap
from iac.transport.base import TransportConfig
from iac.transport.session import hello_params
from iac.wire.dicts import DictionarySet, default_dictionary
from iac.wire.elide import (
    ELIDE_CAPABILITY,
    FORWARD_CAPABILITY,
    MAX_ELIDED_BODY,
    compact_forward,
    forwards_elided,
    restore_forward,
)
from iac.wire.enums import MessageType
from iac.wire.frames import FrameDecoder, FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, sign_message
from tools.vectors.elide_forward import NOW_US, VECTOR_FILE, render_elide_forward_vectors

VECTORS = json.loads(VECTOR_FILE.read_text(encoding="utf-8"))
CONN = VECTORS["connection"]
CORPUS = Path(__file__).resolve().parent.parent / "iac" / "bench" / "corpus" / "test.jsonl"


def outcome(d: RouteDecision) -> str:
    if d.refusal is not None:
        return d.refusal.value
    return "delivered" if d.message is not None else "relayed"


def test_vector_file_is_current() -> None:
    assert VECTOR_FILE.read_text(encoding="utf-8") == render_elide_forward_vectors(), (
        "proto/testvectors/elide-forward-v1.json is stale; rewrite it with "
        "`python -m tools.vectors.elide_forward`"
    )


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=lambda v: v["name"])
def test_vectors_restore_then_check(v: dict[str, Any]) -> None:
    sender, receiver, other = CONN["sender"], CONN["receiver"], CONN["other"]
    received = DictionarySet()
    received.restore_forward = (sender, receiver)  # (peer, self) on carol's side
    (packed,) = FrameDecoder(dictionaries=received).feed_packed(bytes.fromhex(v["frame_hex"]))
    body = packed.unpack(received).body
    assert body.hex() == v["forward_hex"]
    router = Router(receiver, RelayPolicy(relay_unicast=True))
    decision = router.on_forward(body, sender, {sender, other}, NOW_US)
    assert outcome(decision) == v["result"]
    assert sum(router.stats.refused.values()) == (decision.refusal is not None)  # refusals are counted
    # without the capability the same frame is taken as it is: a compact one is malformed
    (plain,) = FrameDecoder(dictionaries=DictionarySet()).feed(bytes.fromhex(v["frame_hex"]))
    assert (plain.body != body) == v["compact"]
    if v["compact"]:
        late = Router(receiver, RelayPolicy(relay_unicast=True))
        assert outcome(late.on_forward(plain.body, sender, {sender, other}, NOW_US)) == "malformed_message"


def _signed(sender: Identity, to: str, text: str, i: int = 0) -> bytes:
    msg = build_message(sender=sender.agent_id, to=to, msg_type=MessageType.RUN, session=Session(7),
                        timestamp_us=NOW_US + i, payload_json=text)  # fmt: skip
    return sign_message(sender, msg)


def test_rule_in_memory() -> None:
    a, b, c = (Identity.from_seed(bytes([n]) * 32) for n in (1, 2, 3))
    ia, ib, ic = a.agent_id, b.agent_id, c.agent_id
    whole = wrap_forward(_signed(a, ic, '"x"'), 7, [ia, ib])
    compact = compact_forward(whole, ib, ic)
    assert compact[:2] == b"\x2a\x20" and ia.encode() not in compact and ib.encode() not in compact
    assert ic.encode() not in compact and restore_forward(compact, ib, ic) == whole
    # toward another receiver `to` stays (field 4); restored with other ends, it is another Forward
    other = compact_forward(whole, ib, ia)
    assert other[:2] == b"\x22\x20" and ic.encode() in other and restore_forward(other, ib, ia) == whole
    assert restore_forward(compact, ia, ic) != whole
    # sent whole when it cannot restore to the same bytes
    unchanged = [
        wrap_forward(_signed(a, ic, '"x"'), 7, [ia, ic]),  # path does not end with the sender
        wrap_forward(_signed(a, ic, '"x"'), 7, [ic, ib]),  # path does not start with `from`
        wrap_forward(_signed(a, ic, '"x"'), 7, [ia, ic, ia, ib]),  # a repeat
        wrap_forward(_signed(a, ic, "0" * MAX_ELIDED_BODY), 7, [ia, ib]),  # large: restoring copies
        whole + b"\x30\x01",  # a field this side does not know: restoring would drop it
        compact,  # already compact
        b"",
        b"\xff\xff",
    ]
    for data in unchanged:
        assert compact_forward(data, ib, ic) == data
    # bodies that are not compact are taken as they are, large compact ones too
    for body in (whole, b"", b"\x2a\x20", b"\x2a\x20" + bytes(MAX_ELIDED_BODY)):
        assert restore_forward(body, ib, ic) == body
    assert forwards_elided(["x", FORWARD_CAPABILITY], (FORWARD_CAPABILITY,))
    assert not forwards_elided([FORWARD_CAPABILITY], [ELIDE_CAPABILITY])
    # only FORWARD bodies are restored
    ds = DictionarySet()
    ds.restore_forward = (ib, ic)
    frames = FrameDecoder(dictionaries=ds).feed(
        encode_frame(FrameType.FORWARD, compact) + encode_frame(FrameType.MESSAGE, compact)
    )
    assert [f.body for f in frames] == [whole, compact]


def test_corpus_round_trips_and_shrinks() -> None:
    a, r, c = (Identity.from_seed(bytes([n]) * 32) for n in (4, 5, 6))
    d = default_dictionary()
    lines = [x for x in CORPUS.read_text(encoding="utf-8").splitlines() if x.strip()][:200]
    whole_bytes = compact_bytes = 0
    for i, line in enumerate(lines):
        fwd = wrap_forward(_signed(a, c.agent_id, line, i), 7, [a.agent_id, r.agent_id])
        compact = compact_forward(fwd, r.agent_id, c.agent_id)
        assert compact != fwd and restore_forward(compact, r.agent_id, c.agent_id) == fwd
        assert parse_forward(restore_forward(compact, r.agent_id, c.agent_id)).path == (
            a.agent_id,
            r.agent_id,
        )
        whole_bytes += len(encode_frame(FrameType.FORWARD, fwd, compress_with=d))
        compact_bytes += len(encode_frame(FrameType.FORWARD, compact, compress_with=d))
    # two AgentIds as hex in `path`, two in the inner message: one raw key is left
    assert whole_bytes - compact_bytes > 60 * len(lines), (whole_bytes, compact_bytes)


def test_hello_announces_the_capability_unless_off() -> None:
    assert FORWARD_CAPABILITY in hello_params(TransportConfig()).capabilities
    caps = hello_params(TransportConfig(elide_forwards=False)).capabilities
    assert caps == (ELIDE_CAPABILITY,)


def _config(*, forwards: bool = True, relay: bool = False) -> NodeConfig:
    return NodeConfig(
        transport=TransportConfig(
            dictionaries=DictionarySet([default_dictionary()]), elide_forwards=forwards
        ),
        relay_policy=RelayPolicy(relay_unicast=relay),
    )


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_relay_sends_compact_forwards_to_a_peer_that_announces_it(transport: str, sockdir: Path) -> None:
    """A — B — C on real sockets, C behind B only: both ways compact when all announce it; whole
    toward (and from) a C without the capability, which still gets A's request and answers."""

    async def line(c_forwards: bool, name: str) -> tuple[int, int]:
        async with (
            Node(listen=[f"unix://{sockdir}/{name}-c.sock"], config=_config(forwards=c_forwards)) as c,
            UnixTap(c.addresses[0]) as tap,
            Node(listen=[listen_url(transport, sockdir, f"{name}-b")], config=_config(relay=True)) as b,
            Node(config=_config()) as a,
        ):

            @c.on(MessageType.RUN)
            async def echo(ctx: Context) -> object:
                return {"echo": ctx.payload, "from": ctx.sender}

            b.add_peer(c.agent_id, tap.url)
            await b.connect(c.agent_id)
            a.add_peer(b.agent_id, *b.addresses)
            await a.connect(b.agent_id)
            for i in range(3):
                reply = await a.request(c.agent_id, MessageType.RUN, {"i": i}, via=b.agent_id, timeout=5)
                assert reply.payload == {"echo": {"i": i}, "from": a.agent_id}  # C verified A
            assert tap.errors == [] and all(n.stats().route_refused == {} for n in (a, b, c))
            down = tap.tapped(DOWN, FrameType.FORWARD)  # C's replies, toward B
            up = [t for t in tap.frames if t.type == FrameType.FORWARD and t.direction != DOWN]
            assert len(up) == 3 and len(down) == 3
            for t in up:  # what the tap restores is what B sent: A's message, path [A, B]
                fwd = t.forward()
                assert tuple(fwd.path) == (a.agent_id, b.agent_id)
                assert (a.agent_id.encode() in t.frame.body) == (not c_forwards)
            for t in down:
                assert tuple(t.forward().path) == (c.agent_id,)
            return sum(len(t.frame.body) for t in up), sum(len(t.frame.body) for t in down)

    async def main() -> None:
        compact = await line(True, "new")
        old = await line(False, "old")
        # B to C: path, from and to out (about 230 B a frame); C to B: path and from (about 100 B)
        assert compact[0] < old[0] - 3 * 200 and compact[1] < old[1] - 3 * 80, (compact, old)

    run(main())
