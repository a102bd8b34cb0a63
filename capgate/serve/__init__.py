"""``capgate serve``: the gateway as an MCP server, for any MCP client.

- :mod:`capgate.serve.config`: the configuration file (who each caller is, where the
  tools come from); no ``mcp`` import.
- :mod:`capgate.serve.server`: :class:`~capgate.serve.server.GatewayMCP`, the MCP
  server in front of a :class:`~gateway.Gateway` (tools/list, tools/call, change
  notifications).
- :mod:`capgate.serve.results`: the gateway's answers as MCP tool results.
- :mod:`capgate.serve.http`: streamable HTTP on loopback behind bearer tokens.
- :mod:`capgate.serve.command`: the ``capgate serve`` command.

Only ``config`` and ``command`` are imported by ``capgate`` itself; the others need
the ``mcp`` extra (``pip install 'capgate[mcp]'``). docs/mcp-server.md is the guide.
"""

from capgate.serve.config import Binding, ConfigError, ServeConfig, load_config, token_digest

__all__ = ["Binding", "ConfigError", "ServeConfig", "load_config", "token_digest"]
