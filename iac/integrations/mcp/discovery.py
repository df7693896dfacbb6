"""Tools in registry records: an agent publishes the MCP tools it serves, and a
:class:`~iac.mesh.MeshClient` finds an agent by tool name.

A record holds at most 64 capabilities of at most 64 characters (``[a-z0-9][a-z0-9._:/-]*``),
while MCP tool names may be longer, use other characters, and a server may have hundreds. So a
tool is published as a digest (:func:`~iac.integrations.mcp.binding.tool_capabilities`):

* ``mcp-tool:`` and 32 hex digits of the name's SHA-256, one per tool, while they fit in the
  room left (56 by default);
* otherwise ``mcp-tools:NN``, the tool's bucket (one of 48): a lookup by bucket returns every
  agent with some tool in it, and :func:`find_tool` asks each of them (``has_tool``, one signed
  request) before it names it.

Beside them the record lists ``mcp/1``.
"""

from __future__ import annotations

from collections.abc import Iterable

from iac.errors import ConfigError, IacError
from iac.integrations.mcp.binding import (
    DEFAULT_TOOL_ROOM,
    merge_capabilities,
    tool_bucket,
    tool_capabilities,
    tool_capability,
)
from iac.integrations.mcp.client import McpClientTransport
from iac.mesh.client import MeshClient
from iac.protocol.records import AgentRecord

#: Capabilities a record holds (iac/protocol/records.py).
MAX_RECORD_CAPABILITIES = 64


async def publish_tools(
    mesh: MeshClient, names: Iterable[str], *, room: int = DEFAULT_TOOL_ROOM
) -> AgentRecord:
    """Publish ``names`` in the agent's record (replacing the tools it published before)."""
    own = merge_capabilities(mesh.capabilities, [])
    room = min(room, MAX_RECORD_CAPABILITIES - len(own))
    if room < 2:
        raise ConfigError(f"the record's {len(own)} own capabilities leave no room for tools")
    mesh.capabilities = merge_capabilities(own, tool_capabilities(names, room=room))
    return await mesh.publish()


async def find_tool(
    mesh: MeshClient, tool: str, *, limit: int | None = None, timeout: float = 5.0
) -> list[str]:
    """AgentIds that serve ``tool``: those that publish its digest, then those of its bucket
    that say they serve it to this caller (each asked once; one that cannot be reached is left
    out)."""
    exact = await mesh.find(tool_capability(tool), limit=limit)
    found = list(exact)
    for agent in await mesh.find(tool_bucket(tool), limit=limit):
        if agent in found:
            continue
        try:
            if await McpClientTransport(mesh.node, agent, timeout=timeout).has_tool(tool):
                found.append(agent)
        except IacError:
            continue
    return found


__all__ = ["MAX_RECORD_CAPABILITIES", "find_tool", "publish_tools"]
