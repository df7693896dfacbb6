"""The receiving side's histogram: how long a node's handlers ran, by message type and outcome."""

from __future__ import annotations

import asyncio
import re

import pytest

import iac
from iac.integrations.metrics import NodeMetrics, handled_outcome


def _counts(page: str, name: str) -> dict[tuple[str, str], float]:
    found = {}
    for m in re.finditer(rf'^{name}_count{{msg_type="(\w+)",outcome="(\w+)"}} (\S+)$', page, re.MULTILINE):
        found[(m.group(1), m.group(2))] = float(m.group(3))
    return found


def test_the_receiving_node_times_its_handlers_by_type_and_outcome() -> None:
    async def main() -> str:
        metrics = NodeMetrics()  # no endpoint: render the registry here
        async with iac.Node(listen="tls://127.0.0.1:0", metrics=metrics) as bob, iac.Node() as alice:

            @bob.on("RUN")
            async def run(ctx: iac.Context) -> str:
                if ctx.payload == "refuse":
                    raise iac.HandlerError(iac.ErrorCode.BAD_REQUEST, "no")
                if ctx.payload == "crash":
                    raise ValueError("a bug")
                return "done"

            alice.add_peer(bob.agent_id, *bob.addresses)
            for payload in ("a", "b"):
                await alice.request(bob.agent_id, "RUN", payload, timeout=5)
            for payload in ("refuse", "crash"):
                with pytest.raises(iac.RemoteError):
                    await alice.request(bob.agent_id, "RUN", payload, timeout=5)
            await alice.request(bob.agent_id, "PING", timeout=5)
            return metrics.render()[0].decode()

    page = asyncio.run(main())
    handled = _counts(page, "iac_handle_duration_seconds")
    assert handled == {
        ("RUN", "ok"): 2.0,
        ("RUN", "bad_request"): 1.0,
        ("RUN", "internal"): 1.0,
        ("PING", "ok"): 1.0,
    }
    assert "# TYPE iac_handle_duration_seconds histogram" in page


def test_the_requester_still_has_its_own_histogram_beside() -> None:
    async def main() -> str:
        metrics = NodeMetrics()
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node(metrics=metrics) as alice:
            bob.on("RUN")(lambda ctx: 1)
            alice.add_peer(bob.agent_id, *bob.addresses)
            await alice.request(bob.agent_id, "RUN", timeout=5)
            return metrics.render()[0].decode()

    page = asyncio.run(main())
    assert _counts(page, "iac_request_duration_seconds") == {("RUN", "reply"): 1.0}
    assert _counts(page, "iac_handle_duration_seconds") == {}  # alice handled nothing


def test_outcome_labels() -> None:
    assert handled_outcome(None) == "ok"
    assert handled_outcome(iac.HandlerError("busy")) == "busy"
    assert handled_outcome(TimeoutError()) == "timeout"
    assert handled_outcome(asyncio.CancelledError()) == "cancelled"
    assert handled_outcome(KeyError("x")) == "internal"
