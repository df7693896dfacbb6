"""MCP over IAC (``pip install 'iac-mesh[mcp]'``): the Model Context Protocol's JSON-RPC carried as
signed IAC messages, between the stock ``mcp`` SDK's client sessions and servers.

* :func:`connect`: the read/write streams of an ``mcp`` ``ClientSession`` toward an agent.
* :func:`serve`: an SDK server (``MCPServer`` or the low-level ``Server``) answering on a node;
  tools see the calling agent as :func:`caller_of`; ``allow`` limits tools per peer.
* :class:`StdioBridge`: an existing stdio MCP server (any language) answering on a node
  (``iac mcp serve --stdio``); ``iac mcp connect`` is the other end for MCP hosts.
* :func:`publish_tools` / :func:`find_tool`: tools in registry records, found by name.

The wire format is docs/PROTOCOL.md, "Extension: MCP over IAC"; a node that serves it announces
``mcp/1`` in its HELLO (:func:`announce`).
"""

from iac.errors import McpBindingError
from iac.integrations.mcp.binding import (
    BUSY,
    CAPABILITY,
    MSG_TYPE,
    TOOL_REFUSED,
    UNREACHABLE,
    VERSION,
    announce,
    tool_bucket,
    tool_capabilities,
    tool_capability,
)
from iac.integrations.mcp.bridge import StdioBridge
from iac.integrations.mcp.client import ClientStats, McpClientTransport, connect
from iac.integrations.mcp.discovery import find_tool, publish_tools
from iac.integrations.mcp.endpoint import Limits, McpCaller, McpEndpoint
from iac.integrations.mcp.server import McpServer, caller_of, serve

__all__ = [
    "BUSY",
    "CAPABILITY",
    "MSG_TYPE",
    "TOOL_REFUSED",
    "UNREACHABLE",
    "VERSION",
    "ClientStats",
    "Limits",
    "McpBindingError",
    "McpCaller",
    "McpClientTransport",
    "McpEndpoint",
    "McpServer",
    "StdioBridge",
    "announce",
    "caller_of",
    "connect",
    "find_tool",
    "publish_tools",
    "serve",
    "tool_bucket",
    "tool_capabilities",
    "tool_capability",
]
