"""Elided from/to (capability elide/1): the sans-IO rule, its vectors, and what two nodes send."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import TRANSPORT_PARAMS, listen_url, run

from iac.errors import MessageRejected
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.transport.base import TransportConfig
from iac.transport.session import hello_params
from iac.wire.dicts import DictionarySet, default_dictionary, message_prefix
from iac.wire.elide import ELIDE_CAPABILITY, MAX_ELIDED_BODY, elide, elides, restore
from iac.wire.enums import MessageType
from iac.wire.frames import FrameDecoder, FrameType, encode_frame
from iac.wire.message import open_message
from tools.vectors.elide import VECTOR_FILE, render_elide_vectors

VECTORS = json.loads(VECTOR_FILE.read_text(encoding="utf-8"))
CORPUS = Path(__file__).resolve().parent.parent / "iac" / "bench" / "corpus" / "test.jsonl"


def test_vector_file_is_current() -> None:
    assert VECTOR_FILE.read_text(encoding="utf-8") == render_elide_vectors(), (
        "proto/testvectors/elide-v1.json is stale; rewrite it with `python -m tools.vectors.elide`"
    )


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=lambda v: v["name"])
def test_vectors_restore_then_verify(v: dict[str, Any]) -> None:
    conn = VECTORS["connection"]
    assert message_prefix(conn["sender"], conn["receiver"]).hex() == conn["prefix_hex"]
    received = DictionarySet()
    received.restore_prefix = bytes.fromhex(conn["prefix_hex"])  # (peer, self) on bob's side
    (packed,) = FrameDecoder(dictionaries=received).feed_packed(bytes.fromhex(v["frame_hex"]))
    body = packed.unpack(received).body
    assert body.hex() == v["message_hex"]
    if v["result"] == "ok":
        assert open_message(body).SerializeToString(deterministic=True) == body
    else:
        with pytest.raises(MessageRejected) as exc_info:
            open_message(body)
        assert exc_info.value.reason == "bad_signature"
    # without the capability the same frame is taken as it is: an elided body has no `from`
    (plain,) = FrameDecoder(dictionaries=DictionarySet()).feed(bytes.fromhex(v["frame_hex"]))
    assert (plain.body != body) == v["elided"]


def test_rule_in_memory() -> None:
    prefix = bytes.fromhex(VECTORS["connection"]["prefix_hex"])
    full = bytes.fromhex(VECTORS["vectors"][0]["message_hex"])
    assert elide(full, prefix) == full[len(prefix) :] and restore(full[len(prefix) :], prefix) == full
    assert restore(full, prefix) == full
    assert elide(prefix, prefix) == prefix  # never an empty body
    assert elide(full, b"") == full
    # large bodies are neither elided nor restored (restoring copies the body)
    big = prefix + b"\x18" + bytes(MAX_ELIDED_BODY)
    assert elide(big, prefix) == big and restore(big[len(prefix) :], prefix) == big[len(prefix) :]
    edge = prefix + b"\x18" + bytes(MAX_ELIDED_BODY - 1)
    assert restore(elide(edge, prefix), prefix) == edge
    assert elides(["x", ELIDE_CAPABILITY], (ELIDE_CAPABILITY,)) and not elides([ELIDE_CAPABILITY], ["x"])
    # only MESSAGE bodies are restored; FORWARD bodies cross relays as they are
    ds = DictionarySet()
    ds.restore_prefix = prefix
    cut = full[len(prefix) :]
    frames = FrameDecoder(dictionaries=ds).feed(
        encode_frame(FrameType.MESSAGE, cut) + encode_frame(FrameType.FORWARD, cut)
    )
    assert [f.body for f in frames] == [full, cut]
    # bodies that are not Messages (raw transport users) cross untouched
    (raw,) = FrameDecoder(dictionaries=ds).feed(encode_frame(FrameType.MESSAGE, b"run:1"))
    assert raw.body == b"run:1"


def test_hello_announces_the_capability_unless_off() -> None:
    on = TransportConfig(elide_forwards=False)  # elide-forward/1 on its own: tests/test_elide_forward.py
    assert hello_params(on).capabilities == (ELIDE_CAPABILITY,)
    assert hello_params(replace(on, capabilities=("a", ELIDE_CAPABILITY))).capabilities == (
        "a",
        ELIDE_CAPABILITY,
    )
    assert hello_params(replace(on, elide_prefixes=False, capabilities=("a",))).capabilities == ("a",)


def _config(*, elide_prefixes: bool) -> NodeConfig:
    return NodeConfig(
        transport=TransportConfig(
            dictionaries=DictionarySet([default_dictionary()]),
            elide_prefixes=elide_prefixes,
            linger_timeout=0.5,
        )
    )


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_nodes_elide_and_keep_no_derived_dictionary(transport: str, sockdir: Path) -> None:
    texts = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()][:40]

    async def measure(server_elides: bool, client_elides: bool, name: str) -> float:
        url = listen_url(transport, sockdir, name)
        async with (
            Node(listen=[url], config=_config(elide_prefixes=server_elides)) as bob,
            Node(config=_config(elide_prefixes=client_elides)) as alice,
        ):
            alice.add_peer(bob.agent_id, *bob.addresses)

            @bob.on(MessageType.RUN)
            async def echo(ctx: Context) -> object:
                return {"ok": True}

            await alice.connect(bob.agent_id)
            conn = alice.connection(bob.agent_id)
            assert conn is not None
            elided = server_elides and client_elides
            assert (ELIDE_CAPABILITY in conn.peer.hello.capabilities) == server_elides
            start = alice.stats().bytes_sent
            for text in texts:
                reply = await alice.request(bob.agent_id, MessageType.RUN, json.loads(text), timeout=5)
                assert reply.payload == {"ok": True}  # bob verified alice's signature, and alice bob's
            sent = alice.stats().bytes_sent - start
            # a pushed dictionary only toward a peer that does not restore from/to
            assert (conn.send_dictionary is None) == elided
            back = bob.connection(alice.agent_id)
            assert back is not None and (back.send_dictionary is None) == elided
            return sent / len(texts)

    async def main() -> None:
        both = await measure(True, True, "a")
        client_old = await measure(True, False, "b")
        server_old = await measure(False, True, "c")
        # derived dictionaries make the 132 prefix bytes a few; elision makes them none
        assert both < min(client_old, server_old), (both, client_old, server_old)

    run(main())
