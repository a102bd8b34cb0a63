"""The MCP transport: run catalogue tools on upstream MCP servers, pinned and reviewed.

Without the ``mcp`` package:

- ``config``: the ``MCP_SERVERS`` / ``MCP_ORACLE`` gate and server specs;
- ``definitions``: what of a tool is pinned, its digest, diffs for people;
- ``pins``: recording listings, accepting and rejecting definitions;
- ``placement``: which catalogue tools run on the servers, and the pin each runs under;
- ``schemas``: values checked against a definition's accepted input and output schemas.

With it (the ``mcp`` extra):

- ``client``: :class:`McpTools`, the adapter, and the order of a call's checks;
- ``sessions``: each server's session, started on demand, held open, stopped; the call;
- ``listing``: a connection's tool listing, read, recorded and current before a call;
- ``loop``: the event-loop thread a synchronous caller reaches the async SDK through;
- ``outcomes``: what each ending of an upstream call means (refused, retryable, unknown).

Only those five import the ``mcp`` package. Of them, code outside imports only
:mod:`capgate.adapters.tools.mcp.client`, and this package imports it only when
``McpTools`` is first asked for, so configuration, pins and the command line work
without the extra installed. See ``docs/mcp-upstreams.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capgate.adapters.tools.mcp.config import (
    MCP_ORACLE_ENV,
    MCP_SERVERS_ENV,
    ServerSpec,
    parse_servers,
    servers_from_env,
)
from capgate.gateway.errors import UpstreamConfigError

if TYPE_CHECKING:
    from capgate.adapters.tools.mcp.client import McpTools

__all__ = [
    "MCP_ORACLE_ENV",
    "MCP_SERVERS_ENV",
    "McpTools",
    "McpUnavailable",
    "ServerSpec",
    "UpstreamConfigError",
    "parse_servers",
    "servers_from_env",
]


class McpUnavailable(ImportError):
    """The ``mcp`` extra is not installed: ``pip install 'capgate[mcp]'``."""


def __getattr__(name: str) -> Any:
    if name == "McpTools":
        try:
            from capgate.adapters.tools.mcp.client import McpTools
        except ImportError as exc:
            raise McpUnavailable(
                "running tools on MCP servers needs the mcp extra: pip install 'capgate[mcp]' "
                f"({exc})"
            ) from exc
        return McpTools
    raise AttributeError(f"module 'capgate.adapters.tools.mcp' has no attribute {name!r}")
