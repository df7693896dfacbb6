"""What an A2A user meets first: the guide's example prints no a2a-sdk warning (the card
``agent_card`` builds has every field A2A requires), and ``client()`` goes over IAC even when the
card lists another binding first (a gateway's card)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("a2a")

import httpx
from a2a.client.card_resolver import parse_agent_card
from a2a.types import AgentSkill
from a2a.utils.proto_utils import warn_on_missing_required_fields
from conftest import run
from test_a2a_gateway import gateway_in_front
from test_a2a_support import Worker, texts, user_message
from test_guides import examples

from iac import ConfigError, Node
from iac.integrations import a2a as ia


def test_the_guide_example_prints_no_spec_compliance_warning(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", examples()["a2a"]], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "hello <alice>: hi" in out.stdout
    assert "not spec-compliant" not in out.stderr and "WARNING" not in out.stderr.upper(), out.stderr


def test_agent_card_has_every_required_field_and_the_nodes_interface() -> None:
    async def main() -> None:
        async with Node(listen=["tls://127.0.0.1:0"]) as node:
            card = ia.agent_card(node, "greeter", description="greets")
            assert warn_on_missing_required_fields(card, "test") is True  # a2a-sdk's own check
            first = ia.parse_interface_url(card.supported_interfaces[0].url)
            assert (first.agent_id, first.addresses) == (node.agent_id, tuple(node.addresses))
            assert [s.name for s in card.skills] == ["greeter"] and card.capabilities.streaming
            skill = AgentSkill(id="sum", name="sum", description="adds", tags=["math"])
            given = ia.agent_card(node, "calc", description="adds", skills=[skill], streaming=False)
            assert [s.id for s in given.skills] == ["sum"] and not given.capabilities.streaming
            with pytest.raises(ConfigError, match="a name and a description"):
                ia.agent_card(node, "greeter", description=" ")
            with pytest.raises(ConfigError, match="media type"):
                ia.agent_card(node, "greeter", description="greets", output_modes=())

    run(main())


def test_client_goes_over_iac_from_a_gateways_card_that_lists_http_first() -> None:
    async def main() -> None:
        worker = Worker()
        async with gateway_in_front(worker) as (_agent, _, gw, server), Node() as me:
            async with httpx.AsyncClient() as http:
                card = parse_agent_card((await http.get(gw.url + ".well-known/agent-card.json")).json())
            assert card.supported_interfaces[0].protocol_binding == "JSONRPC"  # HTTP first
            requests = gw.stats()["requests"]
            client = ia.client(me, card)
            assert isinstance(client._transport, ia.IacTransport)  # type: ignore[attr-defined]
            events = [e async for e in client.send_message(user_message("hello"))]
            assert texts(events) == [f"hi {me.agent_id}"]  # straight to the agent, signed by me
            assert gw.stats()["requests"] == requests  # the gateway saw nothing
            assert server.stats()["calls"]["SendStreamingMessage"] == 1

    run(main())
