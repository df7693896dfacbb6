"""Trace context on the wire (Message field 16) and OpenTelemetry traces across nodes
(iac.integrations.tracing): one trace from a planner through a relay to a researcher and on to a
writer; the relay's span joins it as a link; the received sampled flag decides nothing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from pathlib import Path

import pytest
from conftest import run
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

import iac
from iac.errors import IacError, ProtocolError
from iac.integrations.tracing import MAX_TRACESTATE, Tracing, carried, extract, inject
from iac.wire import Session, build_message, sign_message
from iac.wire._pb.iac_pb2 import Message
from iac.wire.message import open_message
from iac.wire.scan import MESSAGE_SCHEMA, _message_span_fast, _scan, encode_varint, excise_signature

A = iac.Identity.from_seed(b"a" * 32)
B = iac.Identity.from_seed(b"b" * 32)
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def message(traceparent: str = "", tracestate: str = "", deadline_us: int = 0) -> Message:
    msg = build_message(
        sender=A.agent_id, to=B.agent_id, msg_type=iac.MessageType.RUN, session=Session(7),
        timestamp_us=1_700_000_000_000_000, payload_json='{"q": 1}', deadline_us=deadline_us,
    )  # fmt: skip
    if traceparent or tracestate:
        msg.trace.traceparent = traceparent
        msg.trace.tracestate = tracestate
    return msg


# --- the wire ---------------------------------------------------------------------------------


def test_field_16_is_signed_and_survives_the_round_trip():
    msg = message(TP, "vendor=abc")
    data = sign_message(A, msg)
    assert b"\x82\x01" in data  # field 16, length-delimited
    got = open_message(data)
    assert (got.trace.traceparent, got.trace.tracestate) == (TP, "vendor=abc")
    tampered = data.replace(b"vendor=abc", b"vendor=abd")
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        open_message(tampered)  # a relay cannot change it
    assert exc_info.value.reason == "bad_signature"
    assert not open_message(sign_message(A, message())).HasField("trace")


def _len_field(number: int, value: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


def test_a_repeated_trace_context_is_refused_like_every_singular_field():
    data = sign_message(A, message(TP))
    field = _len_field(16, _len_field(1, TP.encode()))
    with pytest.raises(ProtocolError) as exc_info:
        excise_signature(data + field)
    assert exc_info.value.reason == "field_repeated"
    inner_twice = _len_field(16, _len_field(1, TP.encode()) + _len_field(1, TP.encode()))
    with pytest.raises(ProtocolError) as exc_info:
        excise_signature(sign_message(A, message()) + inner_twice)
    assert exc_info.value.reason == "field_repeated"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:  # field 16 is length-delimited, nothing else
        excise_signature(sign_message(A, message()) + b"\x80\x01\x05")
    assert exc_info.value.reason == "malformed_message"
    # Unknown fields inside the trace context are skipped (and may repeat), as in a Message.
    extra = _len_field(16, _len_field(5, b"x") + _len_field(5, b"y"))
    excise_signature(sign_message(A, message()) + extra)


_TRACE_PARTS = [
    _len_field(16, _len_field(1, TP.encode())),
    _len_field(16, _len_field(1, TP.encode()) + _len_field(2, b"a=b")),
    _len_field(16, _len_field(1, b"x") + _len_field(1, b"y")),
    _len_field(16, _len_field(2, b"s" * 600)),
    _len_field(16, b"\x0a\x05ab"),
    _len_field(16, b""),
    b"\x82\x01\x05\x0a",
    b"\x80\x01\x01",
    b"\x88\x01\x02",
    b"\x90\x01\x03",
    b"\x78\x05",
]


def _full(data: bytes) -> tuple[str, object]:
    try:
        return ("ok", _scan(data, 0, len(data), MESSAGE_SCHEMA))
    except IacError as exc:
        return ("err", exc.reason)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_TRACE_PARTS), max_size=4), st.integers(0, 5))
def test_the_fast_path_agrees_with_the_full_scan_on_trace_contexts(parts, n):
    base = sign_message(A, message(deadline_us=n * 1000))
    data = base + b"".join(parts)
    fast = _message_span_fast(data)
    if fast is not None:
        assert _full(data) == ("ok", fast), data.hex()


def test_the_fast_path_takes_canonical_messages_with_a_trace_context():
    rnd = random.Random(5)
    for i in range(50):
        state = ",".join(f"k{j}=v{j}" for j in range(i))[: rnd.randrange(0, 512)]
        data = sign_message(A, message(TP, state, deadline_us=i))
        assert _message_span_fast(data) == _full(data)[1]
        for _ in range(10):  # and defers on anything else
            x = bytearray(data)
            x[rnd.randrange(len(x))] = rnd.randrange(256)
            fast = _message_span_fast(bytes(x))
            if fast is not None:
                assert _full(bytes(x)) == ("ok", fast)


def test_size_caps_on_what_is_taken_and_what_is_sent():
    assert carried(message(TP, "a=b")) == (TP, "a=b")
    assert carried(message(TP + "-00")) is None  # a later traceparent version: not taken
    assert carried(message(TP[:-1])) is None
    assert carried(message(TP, "a=" + "b" * MAX_TRACESTATE)) == (TP, "")  # tracestate alone dropped
    assert extract(message("00-" + "0" * 32 + "-b7ad6b7169203331-01")) is None  # invalid trace id
    assert extract(message("zz" + TP[2:])) is None
    sc = extract(message(TP, "a=b"))
    assert sc is not None and sc.is_remote and f"{sc.trace_id:032x}" == TP[3:35]
    assert sc.trace_state.get("a") == "b"
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        msg = message()
        inject(msg, span)
        assert len(msg.trace.traceparent) == 55 and not msg.trace.tracestate
    big = trace.NonRecordingSpan(
        trace.SpanContext(
            sc.trace_id, sc.span_id, False, trace.TraceFlags(1),
            trace.TraceState([(f"k{i}", "v" * 200) for i in range(4)]),
        )
    )  # fmt: skip
    msg = message()
    inject(msg, big)
    assert msg.trace.traceparent and not msg.trace.tracestate  # over 512 bytes: not sent
    msg = message()
    inject(msg, trace.INVALID_SPAN)
    assert not msg.HasField("trace")


# --- traces across nodes ----------------------------------------------------------------------


class Traced:
    """A tracer provider of one node (its own service), exporting to memory."""

    def __init__(self, name: str, sampler: Sampler | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        kw = {"sampler": sampler} if sampler is not None else {}
        self.provider = TracerProvider(resource=Resource.create({"service.name": name}), **kw)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing(self.provider)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def one(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, (name, [s.name for s in self.spans()])
        return found[0]


async def research_chain(
    sockdir: Path, planner: Traced, relay: Traced, researcher: Traced, writer: Traced
) -> None:
    """planner -(through relay)-> researcher (DELEGATE_TASK); the researcher's handler asks the writer."""
    relay_cfg = iac.NodeConfig(relay_policy=iac.RelayPolicy(relay_unicast=True))
    async with (
        iac.Node(listen=[f"unix://{sockdir}/w.sock"]) as w,
        iac.Node(listen=[f"unix://{sockdir}/r.sock"]) as r,
        iac.Node(listen=[f"unix://{sockdir}/relay.sock"], config=relay_cfg) as hop,
        iac.Node() as p,
    ):
        for t, node in ((planner, p), (relay, hop), (researcher, r), (writer, w)):
            t.tracing.attach(node)

        @w.on(iac.MessageType.RUN)
        def write(ctx: iac.Context) -> str:
            with writer.provider.get_tracer("writer").start_as_current_span("draft"):
                return f"draft of {ctx.payload}"

        @r.on(iac.MessageType.DELEGATE_TASK)
        async def research(ctx: iac.Context) -> str:
            reply = await r.request(w.agent_id, iac.MessageType.RUN, ctx.payload, timeout=5)
            return str(reply.payload)

        hop.add_peer(r.agent_id, *r.addresses)
        r.add_peer(w.agent_id, *w.addresses)
        p.add_peer(hop.agent_id, *hop.addresses)
        p.add_route(r.agent_id, hop.agent_id)
        task = iac.TaskState(task_id="t-1", intent=iac.Intent.ASSIGN_TASK, step=1, steps=2)
        with planner.provider.get_tracer("planner").start_as_current_span("plan"):
            reply = await p.delegate(r.agent_id, task, "the market", timeout=5)
        assert reply.payload == "draft of the market"
        assert hop.stats().routing["relayed"] == 2  # the request there, the reply back


def test_one_trace_from_planner_through_a_relay_to_researcher_and_writer(sockdir: Path) -> None:
    planner, relay, researcher, writer = (Traced(n) for n in ("planner", "relay", "researcher", "writer"))
    run(research_chain(sockdir, planner, relay, researcher, writer))

    plan = planner.one("plan")
    delegate = planner.one("iac request DELEGATE_TASK")
    handle = researcher.one("iac handle DELEGATE_TASK")
    ask = researcher.one("iac request RUN")
    write = writer.one("iac handle RUN")
    draft = writer.one("draft")
    chain = [plan, delegate, handle, ask, write, draft]
    assert len({s.context.trace_id for s in chain}) == 1  # one trace
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id, child.name
    assert [s.kind for s in chain[1:5]] == [
        SpanKind.CLIENT,
        SpanKind.SERVER,
        SpanKind.CLIENT,
        SpanKind.SERVER,
    ]
    assert handle.parent is not None and handle.parent.is_remote and write.parent.is_remote
    assert delegate.attributes["iac.outcome"] == "reply" and ask.attributes["iac.outcome"] == "reply"
    assert delegate.status.status_code is StatusCode.UNSET
    assert handle.attributes["iac.peer"] == delegate.attributes["iac.node"]


# A unicast relay hop does not reach the relayed() hook yet: the Router's decision for a relayed
# unicast (iac/protocol/routing/router.py, _on_unicast) carries no message_bytes, and
# Inbound._on_forward calls observers.relayed only when it does. Broadcast relays do (below).
def test_a_unicast_relay_records_a_span_linked_to_the_trace(sockdir: Path) -> None:
    planner, relay, researcher, writer = (Traced(n) for n in ("planner", "relay", "researcher", "writer"))
    run(research_chain(sockdir, planner, relay, researcher, writer))
    delegate = planner.one("iac request DELEGATE_TASK")
    handle = researcher.one("iac handle DELEGATE_TASK")
    hop = relay.one("iac relay DELEGATE_TASK")
    assert [s.name for s in relay.spans()] == ["iac relay DELEGATE_TASK"]  # the reply carries nothing
    assert hop.parent is None and hop.context.trace_id != delegate.context.trace_id
    assert len(hop.links) == 1
    link = hop.links[0].context
    assert (link.trace_id, link.span_id) == (delegate.context.trace_id, delegate.context.span_id)
    assert hop.attributes["iac.origin"] == delegate.attributes["iac.node"]
    assert hop.attributes["iac.next_hops"] == handle.attributes["iac.node"]


def test_a_broadcast_relay_records_a_span_linked_to_the_trace() -> None:
    async def main() -> tuple[Traced, Traced, Traced]:
        traced = [Traced(n) for n in ("a", "b", "c")]
        nodes = [iac.Node(listen=["tls://127.0.0.1:0"]) for _ in traced]
        got: asyncio.Queue[str] = asyncio.Queue()
        try:
            for t, node in zip(traced, nodes, strict=True):
                await node.start()
                t.tracing.attach(node)
                node.on(iac.MessageType.BROADCAST)(lambda ctx, me=node.agent_id: got.put_nowait(me))
            for x, y in itertools.pairwise(nodes):  # a line: a - b - c
                x.add_peer(y.agent_id, *y.addresses)
                await x.connect(y.agent_id)
            with traced[0].provider.get_tracer("a").start_as_current_span("announce"):
                await nodes[0].broadcast(iac.MessageType.BROADCAST, {"status": "ready"})
            assert {await asyncio.wait_for(got.get(), 5) for _ in range(2)} == {n.agent_id for n in nodes[1:]}
        finally:
            for node in nodes:
                await node.close()
        return traced[0], traced[1], traced[2]

    a, b, c = run(main())
    send = a.one("iac send BROADCAST")
    assert send.kind is SpanKind.PRODUCER and send.parent.span_id == a.one("announce").context.span_id
    for t in (b, c):  # each handler's span is a child of the sending span, in its trace
        handled = t.one("iac handle BROADCAST")
        assert handled.kind is SpanKind.CONSUMER
        assert (handled.context.trace_id, handled.parent.span_id) == (
            send.context.trace_id,
            send.context.span_id,
        )
    hop = b.one("iac relay BROADCAST")  # b flooded it on to c: a span of b's own, linked
    assert hop.parent is None and hop.context.trace_id != send.context.trace_id
    assert [(x.context.trace_id, x.context.span_id) for x in hop.links] == [
        (send.context.trace_id, send.context.span_id)
    ]
    assert hop.attributes["iac.origin"] == hop.attributes["iac.from_peer"] == send.attributes["iac.node"]
    assert hop.attributes["iac.next_hops"] == c.one("iac handle BROADCAST").attributes["iac.node"]
    assert not [s for s in c.spans() if s.name.startswith("iac relay")]  # c is the end of the line


def test_the_received_sampled_flag_decides_nothing(sockdir: Path) -> None:
    # The planner samples nothing, yet its trace id travels; the researcher and writer decide
    # for themselves, and record their spans in the planner's trace.
    planner = Traced("planner", ALWAYS_OFF)
    relay, researcher, writer = Traced("relay"), Traced("researcher"), Traced("writer")
    run(_chain(sockdir, planner, relay, researcher, writer))
    assert planner.spans() == []
    handle = researcher.one("iac handle DELEGATE_TASK")
    assert handle.context.trace_flags.sampled
    assert writer.one("iac handle RUN").context.trace_id == handle.context.trace_id

    # A researcher whose own sampler says no records nothing, though the planner's flag says yes:
    # with the SDK's default ParentBased sampler a peer's flag would have decided.
    planner, researcher = Traced("planner"), Traced("researcher", ParentBased(ALWAYS_OFF))
    relay, writer = Traced("relay"), Traced("writer", ParentBased(TraceIdRatioBased(1.0)))
    run(_chain(sockdir, planner, relay, researcher, writer))
    assert planner.one("iac request DELEGATE_TASK").context.trace_flags.sampled
    assert researcher.spans() == []
    # The writer decides for itself again: it records, in the same trace, under a parent that
    # was not recorded (the researcher's unsampled span still passed its ids on).
    write = writer.one("iac handle RUN")
    assert write.context.trace_id == planner.one("plan").context.trace_id


async def _chain(sockdir: Path, planner: Traced, relay: Traced, researcher: Traced, writer: Traced) -> None:
    d = sockdir / f"c{len(list(sockdir.iterdir()))}"  # a fresh folder (the node makes it private)
    await research_chain(d, planner, relay, researcher, writer)


def test_a_sampler_given_to_tracing_decides_for_traces_from_peers() -> None:
    server = Traced("server")
    off = Tracing(server.provider, sampler=ALWAYS_OFF)
    with off.handling("p" * 64, message(TP, deadline_us=1)) as span:
        assert not span.is_recording()
    with server.tracing.handling("p" * 64, message(TP, deadline_us=1)) as span:
        assert span.is_recording()
    with server.tracing.handling("p" * 64, message(TP[:-2] + "00")) as span:  # not sampled there
        assert span.is_recording()
    spans = server.spans()
    assert [s.kind for s in spans] == [SpanKind.SERVER, SpanKind.CONSUMER]
    assert all(f"{s.context.trace_id:032x}" == TP[3:35] for s in spans)
    # A context that is not taken starts a new trace; the task's own context is not a parent.
    tracer = server.provider.get_tracer("t")
    with (
        tracer.start_as_current_span("unrelated") as unrelated,
        server.tracing.handling("p" * 64, message(TP + "x")) as span,
    ):
        assert span.get_span_context().trace_id != unrelated.get_span_context().trace_id
        assert span.parent is None


def test_requests_that_fail_end_their_client_span_with_the_outcome(sockdir: Path) -> None:
    async def main() -> None:
        client = Traced("client")
        async with iac.Node(listen=[f"unix://{sockdir}/s.sock"]) as server, iac.Node() as c:
            client.tracing.attach(c)
            c.add_peer(server.agent_id, *server.addresses)
            with pytest.raises(iac.RemoteError):
                await c.request(server.agent_id, iac.MessageType.CREATE, {}, timeout=5)

            async def slow(ctx: iac.Context) -> None:
                await asyncio.sleep(5)

            server.on(iac.MessageType.RUN)(slow)
            with pytest.raises(iac.RequestTimeout):
                await c.request(server.agent_id, iac.MessageType.RUN, {}, timeout=0.2)
            await c.send(server.agent_id, iac.MessageType.RUN, "one-way")
            await asyncio.gather(
                *(c.request(server.agent_id, iac.MessageType.PING, timeout=5) for _ in range(3))
            )
        spans = client.spans()
        outcomes = {(s.name, s.attributes.get("iac.outcome")) for s in spans}
        assert ("iac request CREATE", "no_handler") in outcomes
        assert ("iac request RUN", "timeout") in outcomes
        assert ("iac send RUN", None) in outcomes
        assert (
            sum(1 for s in spans if s.name == "iac request PING" and s.attributes["iac.outcome"] == "reply")
            == 3
        )
        errors = [s for s in spans if s.status.status_code is StatusCode.ERROR]
        assert {s.attributes["iac.outcome"] for s in errors} == {"no_handler", "timeout"}
        assert {s.kind for s in spans if s.name.startswith("iac send")} == {SpanKind.PRODUCER}

    run(main())


def test_no_provider_no_spans_no_field(sockdir: Path) -> None:
    # With the API's no-op provider nothing is recorded and nothing is sent.
    async def main() -> None:
        tracing = Tracing(trace.NoOpTracerProvider())
        got: list[Message] = []
        async with iac.Node(listen=[f"unix://{sockdir}/s.sock"]) as server, iac.Node() as c:
            tracing.attach(c)

            class Spy(iac.node.Observer):
                def handling(self, peer: str, msg: Message) -> contextlib.AbstractContextManager[None]:
                    got.append(msg)
                    return contextlib.nullcontext()

            server.observe(Spy())
            server.on(iac.MessageType.RUN)(lambda ctx: 1)
            c.add_peer(server.agent_id, *server.addresses)
            await c.request(server.agent_id, iac.MessageType.RUN, timeout=5)
        assert got and not got[0].HasField("trace")

    run(main())


def test_always_on_is_the_default_decision() -> None:
    assert Tracing(TracerProvider(sampler=ALWAYS_ON))._decide(1, "x", SpanKind.SERVER)
    assert not Tracing(TracerProvider(sampler=ParentBased(ALWAYS_OFF)))._decide(1, "x", SpanKind.SERVER)
    assert Tracing(trace.NoOpTracerProvider())._decide(1, "x", SpanKind.SERVER)
