"""Checks of the receive pipeline that need no I/O: schema, task envelope, guards, rate limit.

Each check returns None to pass or a ``(Refusal, detail)`` pair; the node counts
the refusal and answers with its ERROR code. Nothing here reads a clock: time is
an argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from iac.errors import Refusal
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import Intent, MessageType, type_name
from iac.wire.jsonutil import loads_text

# MessageType values as plain ints (a protobuf enum attribute lookup costs a Python call).
_DELEGATE_TASK: int = MessageType.DELEGATE_TASK

RESPONSE_TYPES: frozenset[int] = frozenset({MessageType.REPLY, MessageType.ERROR, MessageType.ACK})
KNOWN_TYPES: frozenset[int] = frozenset(int(v) for v in MessageType if v != MessageType.UNKNOWN)
KNOWN_INTENTS: frozenset[int] = frozenset(int(v) for v in Intent if v != Intent.INTENT_UNSPECIFIED)
MAX_JSON_DEPTH = 64

Check = tuple[Refusal, str] | None

#: A content guard: ``(message, decoded payload) -> None`` to pass, or a reason string to refuse.
ContentGuard = Callable[[Message, Any], "str | None"]


def decode_payload(payload_json: str) -> tuple[Any, Check]:
    """``payload_json`` decoded (None when empty), or a BAD_PAYLOAD refusal."""
    if not payload_json:
        return None, None
    try:
        value = loads_text(payload_json)
    except (ValueError, RecursionError) as exc:
        return None, (Refusal.BAD_PAYLOAD, f"payload_json is not JSON: {str(exc)[:100]}")
    # Each level of nesting opens a bracket: with few brackets (counted in C, strings
    # included) the value cannot nest too deep, and the walk is skipped.
    if payload_json.count("{") + payload_json.count("[") > MAX_JSON_DEPTH and _depth(value) > MAX_JSON_DEPTH:
        return None, (Refusal.BAD_PAYLOAD, f"payload_json nests deeper than {MAX_JSON_DEPTH}")
    return value, None


def _depth(value: Any) -> int:
    depth = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            depth = max(depth, d)
            todo.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            depth = max(depth, d)
            todo.extend((x, d + 1) for x in v)
        if depth > MAX_JSON_DEPTH:
            break
    return depth


def check_type(msg: Message, allowed: frozenset[int] | None) -> Check:
    mt = int(msg.msg_type)
    if mt not in (allowed if allowed is not None else KNOWN_TYPES):
        return Refusal.BAD_TYPE, f"msg_type {type_name(mt)} is not accepted by this node"
    return None


def check_task(msg: Message, delegators: frozenset[str] | None, sender: str) -> Check:
    """The task envelope: required on DELEGATE_TASK, checked wherever present."""
    is_delegation = msg.msg_type == _DELEGATE_TASK
    if not msg.HasField("task"):
        if is_delegation:
            return Refusal.BAD_TASK, "DELEGATE_TASK without a task envelope"
        return None
    t = msg.task
    if int(t.intent) not in KNOWN_INTENTS:
        return Refusal.BAD_TASK, f"task intent {int(t.intent)} is not one of {sorted(KNOWN_INTENTS)}"
    if not 1 <= t.step <= t.steps:
        return Refusal.BAD_TASK, f"task step {t.step} is not within 1..steps ({t.steps})"
    if not t.task_id:
        return Refusal.BAD_TASK, "task_id is empty"
    if is_delegation and delegators is not None and sender not in delegators:
        return Refusal.DELEGATION_DENIED, "this sender may not delegate tasks to this node"
    return None


def check_deadline(msg: Message, now_us: int) -> Check:
    if msg.deadline and msg.deadline <= now_us:
        return Refusal.DEADLINE_PASSED, f"deadline passed {(now_us - msg.deadline) / 1e6:.3f} s ago"
    return None


#: The longest principal (Message field 19) accepted, in UTF-8 bytes.
MAX_PRINCIPAL = 256


def check_principal(msg: Message) -> Check:
    """Field 19, when set: a gateway's authenticated caller -- short, printable text."""
    p = msg.principal
    if p and (len(p.encode("utf-8")) > MAX_PRINCIPAL or any(ord(c) < 0x20 or ord(c) == 0x7F for c in p)):
        return Refusal.BAD_PAYLOAD, f"the principal is over {MAX_PRINCIPAL} bytes or holds control characters"
    return None


def check_call(payload: Any) -> Check:
    """A COMMAND is ``{"name": str, "args": [...], "kwargs": {...}}`` (args and kwargs optional)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return Refusal.BAD_CALL, 'a COMMAND payload is {"name": str, "args": [...], "kwargs": {...}}'
    if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
        return Refusal.BAD_CALL, "COMMAND args must be a list and kwargs an object"
    if set(payload) - {"name", "args", "kwargs"}:
        return Refusal.BAD_CALL, "COMMAND payload has unknown keys"
    return None


def run_guards(guards: Iterable[ContentGuard], msg: Message, payload: Any) -> Check:
    """Run the content guards in order; the first reason refuses. A guard that raises refuses too."""
    for guard in guards:
        try:
            reason = guard(msg, payload)
        except Exception as exc:  # a broken guard must fail closed
            reason = f"guard {getattr(guard, '__name__', guard)!r} failed: {type(exc).__name__}"
        if reason:
            return Refusal.CONTENT_BLOCKED, str(reason)[:200]
    return None


# --- one example guard ----------------------------------------------------------------------------

_INJECTION_PATTERNS = [
    r"ignore (all |any )?(the )?(previous|prior|above|earlier) (instructions|prompts|messages|rules)",
    r"disregard (all |any )?(the )?(previous|prior|above|earlier) (instructions|prompts|rules)",
    r"forget (all |everything )?(you were told|your (previous )?instructions)",
    r"(reveal|print|show|repeat) (me )?(your|the) (system prompt|hidden instructions|instructions verbatim)",
    r"you are now (in )?(developer|dan|jailbreak|unrestricted) mode",
    r"override (your|the) (safety|system) (rules|instructions|prompt)",
]
_INJECTION_RE = re.compile("|".join(f"(?:{p})" for p in _INJECTION_PATTERNS), re.IGNORECASE)


def _strings(value: Any, limit: int = 10_000) -> Iterable[str]:
    todo = [value]
    seen = 0
    while todo and seen < limit:
        v = todo.pop()
        seen += 1
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


def prompt_injection_guard(msg: Message, payload: Any) -> str | None:
    """An example content guard: refuse payloads with common prompt-injection phrases.

    A phrase list catches only the crude cases; it is an example of the guard
    interface, off by default (``NodeConfig(guards=(prompt_injection_guard,))``).
    """
    for text in _strings(payload):
        m = _INJECTION_RE.search(text)
        if m:
            return f"prompt-injection phrase: {m.group(0)[:60]!r}"
    return None


# --- rate limit -----------------------------------------------------------------------------------


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; :meth:`take` may go into debt and says how long
    to wait until the debt is paid. Time is an argument (monotonic seconds)."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last = now

    def take(self, n: float, now: float) -> float:
        """Take ``n`` tokens; return 0.0, or the seconds until the bucket is out of debt."""
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    @property
    def tokens(self) -> float:
        return self._tokens

    def full(self, now: float) -> bool:
        """Refilled to the burst by ``now`` (forgetting the bucket then loses nothing)."""
        return self._tokens + max(0.0, now - self._last) * self.rate >= self.burst


__all__ = [
    "KNOWN_INTENTS",
    "KNOWN_TYPES",
    "MAX_PRINCIPAL",
    "RESPONSE_TYPES",
    "ContentGuard",
    "TokenBucket",
    "check_call",
    "check_deadline",
    "check_principal",
    "check_task",
    "check_type",
    "decode_payload",
    "prompt_injection_guard",
    "run_guards",
]
