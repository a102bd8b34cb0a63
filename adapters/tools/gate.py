"""The tool registry an application gets by default: in-process, unless the gate says MCP.

The tool-contract seed's config gate, for the whole registry rather than one tool:

- neither ``MCP_SERVERS`` nor ``MCP_ORACLE`` set: the registry holds the in-process
  adapters it is given and nothing else, the offline default (and ``mcp`` is never
  imported);
- either set (:func:`capgate.adapters.tools.mcp.config.servers_from_env`): an MCP
  adapter is attached after them, for the servers the gate names. It runs the catalogue tools whose
  contract names an ``upstream`` on one of those servers, and every tool the catalogue
  leaves unplaced (no ``upstream``, and no in-process adapter before it holds it) on the
  server where a tool of that name was accepted as that catalogue tool.

Either way the grant check is the same, and it comes first: the registry is consulted
only for a call OPA allowed, and an MCP tool runs only under a definition a person
accepted (quarantined until then).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from capgate.adapters.tools.mcp.config import ServerSpec, servers_from_env
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import Adapter
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["tool_registry"]


@contextmanager
def tool_registry(
    catalogue: Catalogue,
    store: Store,
    *local: Adapter,
    environ: Mapping[str, str] | None = None,
    oracle: ServerSpec | None = None,
    connect_timeout: float = 15.0,
) -> Iterator[ToolRegistry]:
    """The registry of ``local`` adapters, with the gate's MCP servers after them.

    ``environ`` is read for the gate (default: the process environment); ``oracle`` is
    the server ``MCP_ORACLE=1`` stands for. The MCP servers are started at their first
    authorised call and stopped when the ``with`` block ends. Raises
    UpstreamConfigError for a gate that names nothing capgate will connect to.
    """
    servers = servers_from_env(environ, oracle=oracle)
    if not servers:
        yield ToolRegistry(*local)
        return
    from capgate.adapters.tools.mcp.client import (
        McpTools,  # the mcp extra, only when the gate asks for it
    )

    with McpTools(catalogue, servers, store, connect_timeout=connect_timeout, unplaced=True) as mcp:
        yield ToolRegistry(*local, mcp)
