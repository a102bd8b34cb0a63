"""``capgate serve``: the gateway as an MCP server, for any MCP client.

- :mod:`capgate.adapters.fronts.mcp.config`: the configuration file (who each caller is, where the
  tools come from); no ``mcp`` import.
- :mod:`capgate.adapters.fronts.mcp.server`: :class:`GatewayMCP`, the MCP server in
  front of a :class:`~capgate.Gateway` (tools/list, tools/call, change
  notifications).
- :mod:`capgate.adapters.fronts.mcp.results`: the gateway's answers as MCP tool results.
- :mod:`capgate.adapters.fronts.mcp.http`: streamable HTTP on loopback behind bearer tokens.
- :mod:`capgate.cli.serve`: the ``capgate serve`` command.

Only ``config`` and ``command`` are imported by ``capgate`` itself; the others need
the ``mcp`` extra (``pip install 'capgate[mcp]'``). docs/mcp-server.md is the guide.
"""

from capgate.adapters.fronts.mcp.config import Binding, ServeConfig, load_config, token_digest
from capgate.gateway.errors import ConfigError

__all__ = ["Binding", "ConfigError", "ServeConfig", "load_config", "token_digest"]
