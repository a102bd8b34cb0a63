"""The oracle as an MCP server: the demo's tool, out of process, over the same contract.

    python -m capgate.demo.oracle_server                        # stdio (MCP_ORACLE=1 runs this)
    python -m capgate.demo.oracle_server --http 127.0.0.1:8931  # streamable HTTP at /mcp

It serves one tool, ``oracle``, whose body is :func:`capgate.demo.tools.oracle.oracle`,
the very function the in-process demo registers: for a given seed the omen drawn
over MCP is byte-identical to the in-process one (``{"seed", "omen"}`` as structured
content). Over HTTP it listens on a loopback address only.

Importing this module needs nothing beyond capgate; running it needs the ``mcp``
extra (``pip install 'capgate[mcp]'``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TypedDict

from capgate.adapters.tools.mcp.config import LOOPBACK_HOSTS, ServerSpec
from capgate.demo.tools.oracle import ORACLE_DESCRIPTION, oracle

__all__ = ["ORACLE_SERVER_ID", "Omen", "main", "oracle_server_spec"]

#: The id the built-in oracle server has in pins and in a contract's ``upstream``.
ORACLE_SERVER_ID = "oracle"


class Omen(TypedDict):
    """The oracle's answer: the seed and its omen (the server's output schema)."""

    seed: str
    omen: str


def oracle_server_spec(python: str | None = None) -> ServerSpec:
    """The stdio command line of this server (what ``MCP_ORACLE=1`` stands for)."""
    return ServerSpec(
        ORACLE_SERVER_ID, command=(python or sys.executable, "-m", "capgate.demo.oracle_server")
    )


def _server() -> object:
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    from capgate.gateway.version import __version__

    server = MCPServer("capgate-oracle", version=__version__, log_level="WARNING")

    def draw(seed: str) -> Omen:
        drawn = oracle(seed)  # the in-process tool's own function: the same omen
        return Omen(seed=drawn["seed"], omen=drawn["omen"])

    server.add_tool(
        draw,
        name="oracle",
        title="Oracle",
        description=ORACLE_DESCRIPTION,
        # Hints for clients; capgate itself reads the catalogue contract, never these.
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
        structured_output=True,
    )
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m capgate.demo.oracle_server",
        description="Serve the demo's oracle tool over MCP (stdio by default).",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead (HOST: 127.0.0.1 or ::1)",
    )
    args = parser.parse_args(argv)
    if args.http is None:
        _server().run("stdio")  # type: ignore[attr-defined]
        return 0
    host, _, port = args.http.rpartition(":")
    host = host.strip("[]")
    if host not in LOOPBACK_HOSTS or not port.isdigit():
        parser.error(f"--http {args.http}: give 127.0.0.1:PORT or [::1]:PORT (loopback only)")
    _server().run("streamable-http", host=host, port=int(port))  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
