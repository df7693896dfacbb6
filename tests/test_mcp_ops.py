"""Operations of MCP over IAC: the calls in ``stats()`` and in Prometheus metrics (scraped over
HTTP), and one OpenTelemetry trace from the MCP client's call through IAC to the tool and back."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

pytest.importorskip("mcp")
pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")

from conftest import run
from mcp.client.session import ClientSession
from mcp_stdio_server import build
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from iac import NodeConfig
from iac.integrations import mcp as im
from iac.integrations.metrics import NodeMetrics
from iac.integrations.tracing import Tracing
from iac.testing import node_pair


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_calls_are_counted_in_stats_and_metrics():
    async def main():
        metrics = NodeMetrics(listen="127.0.0.1:0")
        config = im.announce(NodeConfig())
        async with node_pair("unix", server_config=config) as pair:
            metrics.attach(pair.server)
            server = im.serve(pair.server, build(), allow={"*": {"add"}})
            remove = server.export(metrics)
            async with (
                im.connect(pair.client, pair.server.agent_id) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                for i in range(3):
                    await session.call_tool("add", {"a": i, "b": 1})
                with pytest.raises(Exception, match="not allowed"):
                    await session.call_tool("whoami", {})
                stats = server.stats()
                assert stats["tools"] == {"add": 3} and stats["refused"] == {"tool_refused": 1}
                assert stats["calls"]["tools/call"] == 3 and stats["sessions"] == 1
                samples = await asyncio.to_thread(_scrape, metrics.url)
                assert samples[("iac_mcp_tools_total", (("tool", "add"),))] == 3
                assert samples[("iac_mcp_calls_total", (("method", "tools/call"),))] == 3
                assert samples[("iac_mcp_refused_total", (("reason", "tool_refused"),))] == 1
                assert samples[("iac_mcp_sessions", ())] == 1
            remove()
            samples = await asyncio.to_thread(_scrape, metrics.url)
            assert not any(name.startswith("iac_mcp_") for name, _ in samples)

    run(main())


def test_one_trace_from_the_client_call_through_iac_to_the_tool():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    async def main():
        mcp = build()

        @mcp.tool()
        def traced(x: int) -> int:
            with tracer.start_as_current_span("tool traced"):
                return x * 2

        config = im.announce(NodeConfig())
        async with node_pair("unix", server_config=config) as pair:
            for node in pair:
                Tracing(provider).attach(node)
            im.serve(pair.server, mcp)
            async with (
                im.connect(pair.client, pair.server.agent_id) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                exporter.clear()
                with tracer.start_as_current_span("host call", kind=SpanKind.CLIENT) as root:
                    result = await session.call_tool("traced", {"x": 21})
                assert result.structured_content == {"result": 42}
        return root

    root = run(main())
    spans = [
        s for s in exporter.get_finished_spans() if s.context.trace_id == root.get_span_context().trace_id
    ]
    names = {s.name for s in spans}
    assert {"host call", "iac request RUN", "iac handle RUN", "tool traced"} <= names, names
    # the agent's handler span of the call names the tool, and continues the caller's IAC request
    (handle,) = [s for s in spans if s.name == "iac handle RUN" and s.attributes.get("mcp.tool") == "traced"]
    assert handle.attributes["mcp.method"] == "tools/call" and handle.kind == SpanKind.SERVER
    (request,) = [s for s in spans if s.context.span_id == handle.parent.span_id]
    assert request.name == "iac request RUN" and request.kind == SpanKind.CLIENT
    assert request.parent.span_id == root.get_span_context().span_id  # made inside the host's call
    (tool,) = [s for s in spans if s.name == "tool traced"]  # and the tool ran in the same trace
    assert tool.end_time <= root.end_time
