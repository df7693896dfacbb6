"""Prometheus metrics of a node (iac.integrations.metrics): scraped over HTTP, they match
node.stats(); every node has a registry of its own; per-peer series stay bounded."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from prometheus_client.parser import text_string_to_metric_families

import iac
from iac.errors import ConfigError
from iac.integrations.metrics import OTHER, NodeMetrics, type_name
from iac.integrations.scrape import parse_listen

RUN = iac.MessageType.RUN


def _get(url: str, accept: str = "") -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


async def scrape(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape with a real HTTP client (in a thread); samples by (name, sorted labels)."""
    status, ctype, text = await asyncio.to_thread(_get, metrics.url)
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by_label(samples: dict[Any, float], name: str, label: str) -> dict[str, float]:
    return {dict(k[1])[label]: v for k, v in samples.items() if k[0] == name}


def one(samples: dict[Any, float], name: str) -> float:
    return samples[(name, ())]


async def traffic(client: iac.Node, server: iac.Node, n: int) -> None:
    for i in range(n):
        assert (await client.request(server.agent_id, RUN, i, timeout=5)).payload == i
    with pytest.raises(iac.RemoteError) as exc:  # no handler: an ERROR each way's counters see
        await client.request(server.agent_id, iac.MessageType.CREATE, {}, timeout=5)
    assert exc.value.code == "no_handler"
    await (await client.send(server.agent_id, RUN, "one-way", ack=True)).wait()


def check_matches_stats(samples: dict[Any, float], s: iac.NodeStats) -> None:
    plain = {
        "iac_messages_received_total": s.received,
        "iac_messages_sent_total": s.sent,
        "iac_bytes_received_total": s.bytes_received,
        "iac_bytes_sent_total": s.bytes_sent,
        "iac_handled_total": s.handled,
        "iac_replies_sent_total": s.replies_sent,
        "iac_acks_sent_total": s.acks_sent,
        "iac_acks_received_total": s.acks_received,
        "iac_retransmits_total": s.retransmits,
        "iac_answers_too_large_total": s.answers_too_large,
        "iac_closed_internal_total": s.closed_internal,
        "iac_connections": s.connections,
    }
    assert {k: one(samples, k) for k in plain} == plain
    assert by_label(samples, "iac_refused_total", "reason") == s.refused
    assert by_label(samples, "iac_errors_sent_total", "code") == s.errors_sent
    assert by_label(samples, "iac_errors_received_total", "code") == s.errors_received
    assert by_label(samples, "iac_routing_total", "event") == s.routing
    depth = by_label(samples, "iac_queue_depth", "queue")
    assert depth == {
        "backlog": s.backlog, "running": s.running, "ordered": s.ordered_queued,
        "reorder_held": s.reorder_held, "pending": s.pending_requests, "unacked": s.unacked,
        "answer_cache": s.answer_cache,
    }  # fmt: skip
    assert by_label(samples, "iac_peer_state_entries", "table") == s.peer_state
    transports = by_label(samples, "iac_connections_by_transport", "transport")
    connected = [link for link in s.peer_links.values() if link["connected"]]
    assert sum(transports.values()) == len(connected)
    for link in connected:
        assert transports[link["transport"]] >= 1
    in_flight = by_label(samples, "iac_peer_in_flight", "peer")
    assert in_flight == {p: link["in_flight"] for p, link in s.peer_links.items()}
    rtt = by_label(samples, "iac_peer_rtt_seconds", "peer")
    assert rtt == {
        p: pytest.approx(link["rtt_ms"] / 1000)
        for p, link in s.peer_links.items()
        if link["rtt_ms"] is not None
    }


def test_scraped_figures_match_node_stats(sockdir: Path) -> None:
    async def main() -> None:
        sm, cm = NodeMetrics("127.0.0.1:0"), NodeMetrics("127.0.0.1:0")
        async with (
            iac.Node(listen=[f"unix://{sockdir}/s.sock"], metrics=sm) as server,
            iac.Node(metrics=cm) as client,
        ):
            server.on(RUN)(lambda ctx: ctx.payload)
            client.add_peer(server.agent_id, *server.addresses)
            await traffic(client, server, 5)
            for node, metrics in ((server, sm), (client, cm)):
                samples = await scrape(metrics)
                check_matches_stats(samples, node.stats())
                assert by_label(samples, "iac_node_info", "agent_id") == {node.agent_id: 1}
            c = await scrape(cm)
            assert one(c, "iac_messages_sent_total") >= 7
            assert by_label(c, "iac_errors_received_total", "code") == {"no_handler": 1}
            assert by_label(c, "iac_connections_by_transport", "transport") == {"unix": 1}
            assert by_label(c, "iac_peer_connected", "peer") == {server.agent_id: 1}
            hist = {
                (dict(k[1])["msg_type"], dict(k[1])["outcome"]): v
                for k, v in c.items()
                if k[0] == "iac_request_duration_seconds_count"
            }
            assert hist == {("RUN", "reply"): 5, ("CREATE", "no_handler"): 1}
            s = await scrape(sm)
            assert by_label(s, "iac_errors_sent_total", "code") == {"no_handler": 1}
            assert one(s, "iac_handled_total") == 6  # five requests and the one-way message
            assert not any(k[0] == "iac_request_duration_seconds_count" for k in s)
            assert one(s, "iac_bytes_received_total") > 0

    run(main())


def test_every_node_has_a_registry_of_its_own(sockdir: Path) -> None:
    async def main() -> None:
        sm, cm = NodeMetrics("127.0.0.1:0"), NodeMetrics("127.0.0.1:0")
        assert sm.registry is not cm.registry
        async with (
            iac.Node(listen=[f"unix://{sockdir}/s.sock"], metrics=sm) as server,
            iac.Node(metrics=cm) as client,
        ):
            server.on(RUN)(lambda ctx: ctx.payload)
            client.add_peer(server.agent_id, *server.addresses)
            await traffic(client, server, 3)
            s, c = await scrape(sm), await scrape(cm)
            assert sm.address != cm.address
            assert by_label(s, "iac_node_info", "agent_id") == {server.agent_id: 1}
            assert by_label(c, "iac_node_info", "agent_id") == {client.agent_id: 1}
            assert one(s, "iac_handled_total") == 4 and one(c, "iac_handled_total") == 0
            assert one(s, "iac_replies_sent_total") == 3 and one(c, "iac_replies_sent_total") == 0
            assert by_label(s, "iac_peer_connected", "peer") == {client.agent_id: 1}
            assert by_label(c, "iac_peer_connected", "peer") == {server.agent_id: 1}
            with pytest.raises(ConfigError, match="one node"):
                sm.attach(client)

    run(main())


def test_per_peer_series_are_bounded_with_50_peers(sockdir: Path) -> None:
    async def main() -> None:
        hm = NodeMetrics("127.0.0.1:0", top_peers=20)
        async with iac.Node(listen=[f"unix://{sockdir}/hub.sock"], metrics=hm) as hub:
            hub.on(RUN)(lambda ctx: ctx.payload)
            peers = [iac.Node() for _ in range(50)]
            try:
                for p in peers:
                    await p.start()
                    p.add_peer(hub.agent_id, *hub.addresses)
                    p.on(RUN)(lambda ctx: ctx.payload)
                await asyncio.gather(*(p.request(hub.agent_id, RUN, 1, timeout=10) for p in peers))
                busy = peers[-1]
                for _ in range(5):  # the busiest peer has a series of its own
                    await busy.request(hub.agent_id, RUN, 1, timeout=10)
                for p in peers[:3]:  # and so do the peers the hub asked something (an RTT each)
                    await hub.request(p.agent_id, RUN, 1, timeout=10)
                samples = await scrape(hm)
                s = hub.stats()
                assert len(s.peer_links) == 50
                for name in ("iac_peer_in_flight", "iac_peer_connected"):
                    series = by_label(samples, name, "peer")
                    assert len(series) == 21 and OTHER in series, name
                    assert busy.agent_id in series
                    assert {p.agent_id for p in peers[:3]} <= series.keys()
                connected = by_label(samples, "iac_peer_connected", "peer")
                assert connected[OTHER] == 30 and sum(connected.values()) == 50
                assert one(samples, "iac_peers_aggregated") == 30
                rtt = by_label(samples, "iac_peer_rtt_seconds", "peer")
                assert set(rtt) == {p.agent_id for p in peers[:3]}  # only the hub's requests give RTTs
                assert sum(1 for k in samples if dict(k[1]).get("peer")) <= 3 * 21
            finally:
                for p in peers:
                    await p.close()

    run(main(), timeout=60)


def test_bounds_hold_for_codes_a_peer_chooses() -> None:
    class FakeNode:
        agent_id = "f" * 64

        def __init__(self) -> None:
            self.removed = False

        def observe(self, observer: Any) -> Any:
            self.observer = observer
            return lambda: setattr(self, "removed", True)

        def stats(self) -> Any:
            link = {"connected": True, "transport": "quic", "address": "", "in_flight": 1}
            links = {f"{i:064x}": {**link, "rtt_ms": float(i)} for i in range(1, 6)}
            return _stats(errors_received={"busy": 2, "x" * 64: 1, "y" * 60: 4}, peer_links=links)

    async def main() -> None:
        m = NodeMetrics(top_peers=2)
        node = FakeNode()
        detach = m.attach(node)  # type: ignore[arg-type]
        node.observer.answered("p", 9, 0.01, "made-up-code")
        node.observer.answered("p", 9, 0.02, "timeout")
        body, ctype = m.render()
        assert ctype.startswith("text/plain")
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
        }
        assert by_label(samples, "iac_errors_received_total", "code") == {"busy": 2, OTHER: 5}
        outcomes = {dict(k[1])["outcome"] for k in samples if k[0] == "iac_request_duration_seconds_count"}
        assert outcomes == {OTHER, "timeout"}
        assert by_label(samples, "iac_peer_in_flight", "peer").keys() == {f"{5:064x}", f"{4:064x}", OTHER}
        assert by_label(samples, "iac_peer_rtt_seconds", "peer")[OTHER] == pytest.approx(0.002)  # mean
        body, ctype = m.render("application/openmetrics-text; version=1.0.0")
        assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
        detach()
        assert node.removed and m.address is None
        with pytest.raises(ConfigError, match="serves no /metrics endpoint: it has no listen address"):
            m.url  # noqa: B018

    run(main())


def _stats(**kw: Any) -> iac.NodeStats:
    base: dict[str, Any] = {f: 0 for f in iac.NodeStats.__dataclass_fields__}
    tables = ("refused", "errors_sent", "errors_received", "routing", "route_refused", "files", "zero_rtt")
    base.update({t: {} for t in (*tables, "peer_links", "peer_state", "file_refused")})
    base.update(kw)
    return iac.NodeStats(**base)


def test_endpoint_answers_only_metrics_and_stops_with_the_node(sockdir: Path) -> None:
    async def main() -> None:
        m = NodeMetrics("127.0.0.1:0")
        async with iac.Node(listen=[f"unix://{sockdir}/n.sock"], metrics=m):
            assert m.address is not None
            host, port = m.address
            base = f"http://{host}:{port}"
            assert (await asyncio.to_thread(_get, base + "/nothing"))[0] == 404
            status, ctype, text = await asyncio.to_thread(
                _get, base + "/metrics", "application/openmetrics-text; version=1.0.0"
            )
            assert status == 200 and ctype.startswith("application/openmetrics-text")
            assert "iac_messages_sent" in text and text.endswith("# EOF\n")
            assert 'iac_zero_rtt_total{event="early_dials"} 0' in text
            # A client that never finishes its request does not stop the others.
            _r, w = await asyncio.open_connection(host, port)
            w.write(b"GET /metr")
            assert (await asyncio.to_thread(_get, base + "/metrics"))[0] == 200
            w.close()
        assert m.address is None
        with pytest.raises(OSError):
            await asyncio.to_thread(urllib.request.urlopen, base + "/metrics", None, 2)

    run(main())


def test_listen_addresses_and_labels() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9464", "host:", "host:99999", "host:x"):
        with pytest.raises(ConfigError):
            NodeMetrics(bad)
    with pytest.raises(ConfigError):
        NodeMetrics(top_peers=-1)
    assert type_name(int(iac.MessageType.DELEGATE_TASK)) == "DELEGATE_TASK"
    assert type_name(99) == "99"
