"""What an MCP over IAC server allows: the per-peer tool allow-list, the bounds on sessions, calls
and listen streams (:class:`Limits`), and the bound on what its counters hold."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from iac.errors import ConfigError

#: ``allow``: AgentId -> the tools it may call ("*" as an AgentId: every caller; "*" as a tool:
#: every tool), or a function ``(agent_id, tool) -> bool``. None: every caller, every tool.
Allow = Mapping[str, Collection[str]] | Callable[[str, str], bool] | None

#: Keys one counter of ``stats()`` holds (callers choose method and tool names): the rest are
#: counted under ``other``.
MAX_COUNTER_KEYS = 256
#: The label of each counter of ``stats()`` in metrics (:meth:`McpEndpoint.export`).
METRIC_LABELS = {"calls": "method", "tools": "tool", "refused": "reason", "errors": "code", "events": "event"}


def bump(counter: Counter[str], key: str) -> None:
    """Count ``key``, or ``other`` once the counter holds :data:`MAX_COUNTER_KEYS` keys."""
    if key not in counter and len(counter) >= MAX_COUNTER_KEYS:
        key = "other"
    counter[key] += 1


@dataclass(frozen=True)
class Limits:
    """Bounds of an :class:`McpEndpoint` (the defaults are what ``iac mcp serve`` states)."""

    #: Requests in flight from one calling agent, and in all.
    calls_per_peer: int = 8
    calls_total: int = 48
    #: Listen streams (a session's stream of what belongs to no request) per calling agent, and
    #: in all. Each call and each listen stream holds one of the node's handlers while it runs:
    #: ``calls_total + listens_total`` must fit in ``NodeConfig.max_handlers`` (64).
    listens_per_peer: int = 2
    listens_total: int = 16
    #: Sessions one calling agent may hold, and in all.
    sessions_per_peer: int = 8
    sessions_total: int = 256
    #: A session nobody used for this long is closed (when a new one is opened); a listen stream
    #: ends after this long (the caller opens it again), so an abandoned session becomes idle.
    session_idle: float = 600.0
    #: Largest JSON-RPC message taken, in bytes.
    max_message_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("calls_per_peer", "calls_total", "sessions_per_peer", "sessions_total"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.listens_per_peer < 0 or self.listens_total < 0:
            raise ConfigError("listens_per_peer and listens_total must not be negative")
        if self.session_idle <= 0 or self.max_message_bytes < 1024:
            raise ConfigError("session_idle must be positive and max_message_bytes at least 1024")


def allowed(allow: Allow, agent_id: str, tool: str) -> bool:
    if allow is None:
        return True
    if callable(allow):
        return bool(allow(agent_id, tool))
    for who in (agent_id, "*"):
        tools = allow.get(who)
        if tools is not None and (tool in tools or "*" in tools):
            return True
    return False


__all__ = ["MAX_COUNTER_KEYS", "METRIC_LABELS", "Allow", "Limits", "allowed", "bump"]
