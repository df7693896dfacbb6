"""The public surface: what ``iac`` and each layer package export (the API reference holds them to
their documentation: tests/test_reference.py), and the conveniences an agent author relies on."""

from __future__ import annotations

import asyncio
import importlib

import pytest

import iac
from iac.node.types import Reply
from iac.wire._pb import iac_pb2

MODULES = ("iac", "iac.errors", "iac.wire", "iac.protocol", "iac.stores", "iac.transport", "iac.node",
           "iac.mesh", "iac.testing")  # fmt: skip


@pytest.mark.parametrize("module", MODULES)
def test_each_module_exports_each_name_once_and_has_it(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert len(set(exported)) == len(exported)
    for name in exported:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} is listed but missing"


def test_the_top_level_is_small() -> None:
    assert 25 <= len(iac.__all__) <= 35
    assert set(dir(iac)) == set(iac.__all__)


#: Names that were importable from ``iac`` until the public surface was narrowed (a sample of the
#: 174 that went in 0.1.0, CHANGELOG.md): each lives only in its layer package now.
LEFT_THE_TOP_LEVEL = {
    "MessageRejected": "iac.errors",
    "ProtocolError": "iac.errors",
    "KeyBook": "iac.mesh",
    "ReplayGuard": "iac.protocol",
    "SqliteReplayStore": "iac.stores",
    "dial": "iac.transport",
    "build_message": "iac.wire",
}


@pytest.mark.parametrize(("name", "package"), sorted(LEFT_THE_TOP_LEVEL.items()))
def test_a_name_that_left_the_top_level_is_gone_from_it_and_in_its_package(name: str, package: str) -> None:
    with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
        getattr(iac, name)
    assert name in importlib.import_module(package).__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        iac.Nope  # noqa: B018


def test_message_types_and_intents_are_python_enums_equal_to_the_wire_schema() -> None:
    assert [(t.name, int(t)) for t in iac.MessageType] == sorted(
        iac_pb2.MessageType.items(), key=lambda kv: kv[1]
    )
    assert [(t.name, int(t)) for t in iac.Intent] == sorted(iac_pb2.Intent.items(), key=lambda kv: kv[1])
    assert str(iac.MessageType.RUN) == "RUN" and f"{iac.MessageType.RUN!r}".endswith("RUN: 9>")


def test_reply_repr_shows_no_signature_bytes() -> None:
    msg = iac_pb2.Message(payload_json='{"a":1}', signature=b"\xaa" * 64, extra_data=b"xyz")
    setattr(msg, "from", "ab" * 32)
    text = repr(Reply(msg, {"a": 1}))
    assert "signature" not in text and "\\xaa" not in text
    assert "{'a': 1}" in text and "3 bytes" in text


def test_node_takes_types_by_name_and_refuses_unknown_names_and_bad_arguments() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:  # one URL, a str
            assert bob.addresses and bob.addresses[0].startswith("tls://")
            bob.on("run")(lambda ctx: {"type": str(iac.MessageType(ctx.msg_type))})
            bob.expose(lambda a, timeout=0: a + timeout, name="add")
            alice.add_peer(bob.agent_id, *bob.addresses)
            assert (await alice.request(bob.agent_id, "RUN", timeout=5)).payload == {"type": "RUN"}
            assert (await alice.request(bob.agent_id, iac.MessageType.RUN, timeout=5)).payload == {
                "type": "RUN"
            }
            assert bob.handler("RUN") is bob.handler(9) is not None
            assert await alice.call(bob.agent_id, "add", 2, timeout=5) == 2
            with pytest.raises(iac.ConfigError, match=r"unknown message type 'RNU'.*RUN"):
                await alice.request(bob.agent_id, "RNU", timeout=5)
            with pytest.raises(iac.ConfigError, match="unknown message type"):
                bob.on("NOPE")
            with pytest.raises(iac.ConfigError, match="handled by the node"):
                bob.on("REPLY")
            with pytest.raises(iac.ConfigError, match=r"iac\.TaskState"):
                await alice.delegate(bob.agent_id, {"task_id": "t"}, timeout=5)  # type: ignore[arg-type]
            for bad in (float("inf"), float("nan"), 0, -1):
                with pytest.raises(iac.ConfigError, match="positive, finite"):
                    await alice.request(bob.agent_id, "RUN", timeout=bad)

    asyncio.run(main())
