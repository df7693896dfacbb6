"""OpenTelemetry traces across nodes (``pip install 'iac-mesh[otel]'``).

::

    tracing = Tracing(tracer_provider)      # or the global provider
    remove = tracing.attach(node)           # or node.observe(tracing)

A node that traces carries the W3C trace context of the span it sends from in ``Message`` field 16
(docs/PROTOCOL.md, "Trace context"), and the node that handles the message continues the trace:

* a request (a message with a deadline) gets a CLIENT span ``iac request TYPE`` from sending to its
  answer; a one-way message gets a PRODUCER span ``iac send TYPE``; the context of that span is
  what travels. REPLY, ERROR, ACK, CANCEL, CREDIT and FILE_TRANSFER carry nothing and get no span
  (a file is thousands of messages: the span that sends it covers them).
* the receiver runs the handler in a SERVER span ``iac handle TYPE`` (CONSUMER for a one-way
  message) whose parent is the received context, so that what the handler sends is in the trace.
* a relay records ``iac relay TYPE``, a span of its own trace with a LINK to the received context:
  it cannot make its span the parent of the next hop, because the trace context is inside the
  message the origin signed, and a relay cannot change a byte of it.

The received sampled flag is not trusted: a peer must not be able to switch this node's tracing on
(cost) or off (hiding). Before a SERVER/CONSUMER span starts, the flag of the received context is
replaced by this node's own decision: the sampler given, else the tracer provider's sampler asked
as for a new trace (with the SDK's ``ParentBased`` sampler, its root sampler), else "sampled". A
ParentBased sampler then follows this node's decision, and a ratio sampler
(``TraceIdRatioBased``) decides the same on every node that uses the same ratio.

What is received is size-checked before it is used: ``traceparent`` exactly 55 characters
(version 00) and valid, else the whole context is ignored (the handler's span starts a new
trace); ``tracestate`` at most 512 bytes, else it alone is dropped. The same caps hold for what
this node sends.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.context import Context as TraceContextValue
    from opentelemetry.sdk.trace.sampling import Decision, Sampler
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        Span,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TracerProvider,
    )
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("iac.integrations.tracing needs OpenTelemetry: pip install 'iac-mesh[otel]'") from exc

from iac.node.node import Node
from iac.node.observe import Observer
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.message import FLAG_STREAM

#: The length of a version-00 ``traceparent`` (W3C Trace Context); others are not taken.
TRACEPARENT_SIZE = 55
#: The largest ``tracestate`` sent or taken, in bytes (the W3C limit is 512 characters).
MAX_TRACESTATE = 512
#: Requests one task may have open (sent, not answered) before the oldest span is ended.
#: (A task waits for one request at a time; a stream's request is never reported answered.)
MAX_OPEN_PER_TASK = 64

_NO_SPAN = frozenset(
    int(t)
    for t in (
        MessageType.REPLY,
        MessageType.ERROR,
        MessageType.ACK,
        MessageType.CANCEL,
        MessageType.CREDIT,
        MessageType.FILE_TRANSFER,
    )
)
_PROPAGATOR = TraceContextTextMapPropagator()
_SCOPE = "iac.integrations.tracing"


def _type_name(msg_type: int) -> str:
    try:
        return MessageType(msg_type).name
    except ValueError:
        return str(msg_type)


def carried(msg: Message) -> tuple[str, str] | None:
    """The ``(traceparent, tracestate)`` that ``msg`` carries, size-checked: None if it carries
    none or its traceparent is not 55 characters; tracestate "" if over 512 bytes."""
    if not msg.HasField("trace"):
        return None
    parent, state = msg.trace.traceparent, msg.trace.tracestate
    if len(parent) != TRACEPARENT_SIZE:
        return None
    if len(state.encode()) > MAX_TRACESTATE:
        state = ""
    return parent, state


def extract(msg: Message) -> SpanContext | None:
    """The valid remote span context that ``msg`` carries, or None."""
    found = carried(msg)
    if found is None:
        return None
    carrier = {"traceparent": found[0]}
    if found[1]:
        carrier["tracestate"] = found[1]
    sc = trace.get_current_span(_PROPAGATOR.extract(carrier, context=TraceContextValue())).get_span_context()
    return sc if sc.is_valid else None


def inject(msg: Message, span: Span) -> None:
    """Put the W3C trace context of ``span`` into ``msg`` field 16 (within the size caps)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span, TraceContextValue()))
    parent = carrier.get("traceparent", "")
    if len(parent) != TRACEPARENT_SIZE:
        return
    msg.trace.traceparent = parent
    state = carrier.get("tracestate", "")
    if state and len(state.encode()) <= MAX_TRACESTATE:
        msg.trace.tracestate = state


class Tracing(Observer):
    """An :class:`~iac.node.Observer` that makes OpenTelemetry spans of what a node sends, handles
    and relays (see the module). ``tracer_provider``: the provider to use (default: the global
    one). ``sampler``: what decides whether a trace that arrives from a peer is recorded here
    (default: the provider's own sampler, asked as for a new trace)."""

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, sampler: Sampler | None = None
    ) -> None:
        self._provider = tracer_provider
        self._sampler = sampler
        self._tracers: dict[int, trace.Tracer] = {}
        self._agent_id = ""
        #: Per task: the CLIENT spans of its requests not answered yet, by ``(peer, msg_type)``
        #: (a request is sent and answered in the caller's task; gather() gives each its own).
        self._open: weakref.WeakKeyDictionary[asyncio.Task[Any], dict[tuple[str, int], Span]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def tracer(self) -> trace.Tracer:
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        tracer = self._tracers.get(id(provider))
        if tracer is None:  # the global provider may be set after this object was made
            tracer = self._tracers[id(provider)] = provider.get_tracer(_SCOPE)
        return tracer

    def attach(self, node: Node) -> Callable[[], None]:
        """Observe ``node`` (its spans name it in ``iac.node``); returns what detaches."""
        self._agent_id = node.agent_id
        return node.observe(self)

    def _attributes(self, msg_type: int, peer: str) -> dict[str, str]:
        attrs = {"rpc.system": "iac", "iac.msg_type": _type_name(msg_type), "iac.peer": peer}
        if self._agent_id:
            attrs["iac.node"] = self._agent_id
        return attrs

    # --- sending -------------------------------------------------------------------------------

    def outgoing(self, msg: Message) -> None:
        if msg.msg_type in _NO_SPAN:
            return
        request = msg.deadline != 0
        verb, kind = ("request", SpanKind.CLIENT) if request else ("send", SpanKind.PRODUCER)
        attrs = self._attributes(msg.msg_type, msg.to)
        span = self.tracer.start_span(f"iac {verb} {_type_name(msg.msg_type)}", kind=kind, attributes=attrs)
        inject(msg, span)
        task = asyncio.current_task()
        if not request or msg.flags & FLAG_STREAM or task is None:  # a stream's end is not reported
            span.end()
            return
        open_ = self._open.setdefault(task, {})
        key = (msg.to, int(msg.msg_type))
        stale = open_.pop(key, None)
        if stale is not None:
            stale.end()
        if len(open_) >= MAX_OPEN_PER_TASK:
            open_.pop(next(iter(open_))).end()
        open_[key] = span

    def answered(self, peer: str, msg_type: int, seconds: float, outcome: str) -> None:
        task = asyncio.current_task()
        open_ = self._open.get(task) if task is not None else None
        span = open_.pop((peer, msg_type), None) if open_ is not None else None
        if span is None:  # it failed before it was sent: a span of the time it took
            start = time.time_ns() - int(seconds * 1e9)
            attrs = self._attributes(msg_type, peer)
            name = f"iac request {_type_name(msg_type)}"
            span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attrs, start_time=start)
        span.set_attribute("iac.outcome", outcome)
        if outcome != "reply":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    # --- receiving -----------------------------------------------------------------------------

    def _decide(self, trace_id: int, name: str, kind: SpanKind) -> bool:
        """This node's sampling decision for a trace that arrives from a peer."""
        sampler = self._sampler
        if sampler is None:
            provider = self._provider if self._provider is not None else trace.get_tracer_provider()
            sampler = getattr(provider, "sampler", None)
            if not isinstance(sampler, Sampler):
                return True
        result = sampler.should_sample(TraceContextValue(), trace_id, name, kind)
        return result.decision is Decision.RECORD_AND_SAMPLE

    def _parent(self, msg: Message, name: str, kind: SpanKind) -> TraceContextValue:
        """The context a span for ``msg`` starts in: the received one with this node's sampled flag,
        or an empty one (a new trace; never the context the dispatching task happens to hold)."""
        sc = extract(msg)
        if sc is None:
            return TraceContextValue()
        flags = TraceFlags(
            TraceFlags.SAMPLED if self._decide(sc.trace_id, name, kind) else TraceFlags.DEFAULT
        )
        local = SpanContext(
            sc.trace_id, sc.span_id, is_remote=True, trace_flags=flags, trace_state=sc.trace_state
        )
        return trace.set_span_in_context(NonRecordingSpan(local), TraceContextValue())

    def handling(self, peer: str, msg: Message) -> AbstractContextManager[Any]:
        return self._handling(peer, msg)

    @contextmanager
    def _handling(self, peer: str, msg: Message) -> Iterator[Span]:
        kind = SpanKind.SERVER if msg.deadline else SpanKind.CONSUMER
        name = f"iac handle {_type_name(msg.msg_type)}"
        parent = self._parent(msg, name, kind)
        attrs = self._attributes(msg.msg_type, peer)
        with self.tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attrs) as span:
            yield span

    def relayed(self, origin: str, msg: Message, from_peer: str, to: list[str]) -> None:
        sc = extract(msg)
        if sc is None:
            return  # nothing to correlate with: an untraced message starts no trace at a relay
        attrs = self._attributes(msg.msg_type, msg.to)
        attrs |= {"iac.origin": origin, "iac.from_peer": from_peer, "iac.next_hops": ",".join(to)[:1024]}
        name = f"iac relay {_type_name(msg.msg_type)}"
        span = self.tracer.start_span(name, context=TraceContextValue(), links=[Link(sc)], attributes=attrs)
        span.end()


__all__ = [
    "MAX_OPEN_PER_TASK",
    "MAX_TRACESTATE",
    "TRACEPARENT_SIZE",
    "Tracing",
    "carried",
    "extract",
    "inject",
]
