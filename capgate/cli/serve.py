"""``capgate serve``: the gateway as an MCP server, over stdio or streamable HTTP.

Registered by :mod:`capgate.cli.main`; this module imports neither ``mcp`` nor anything
that does until the command runs, so ``capgate`` works where the ``mcp`` extra is not
installed (and says so when ``serve`` is asked for).

The order of start-up is the order of what can be wrong: the configuration (and the
entry points it names), the catalogue, the store (never created here: a mistyped
path is an error), every binding's tenant in that store, the upstream MCP servers'
adapter (:class:`capgate.adapters.tools.mcp.McpTools`, when ``upstreams`` names any, or else the
``MCP_SERVERS`` / ``MCP_ORACLE`` gate), then OPA (embedded, started from the main
thread so it dies with this process, or ``--opa``/``$CAPGATE_OPA_URL``), and only
then the transport. Operations a previous process left running are reconciled
first (``Gateway.reconcile``), and again every ``reconcile_seconds`` while it serves
(:class:`capgate.gateway.service.recovery.Reconciler`): unknown outcomes are looked up
then, whether or not any agent calls again.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from capgate.adapters.fronts.mcp.config import ServeConfig, bindings_of, load_config
from capgate.adapters.tools.mcp.config import (
    MCP_ORACLE_ENV,
    MCP_SERVERS_ENV,
    ServerSpec,
    servers_from_env,
)
from capgate.cli.commands.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    STORE_ENV,
    Actions,
    exit_codes,
    opened_store,
)
from capgate.demo.oracle_server import oracle_server_spec
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import ConfigError, InvalidInput, UnknownTenant
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.recovery import Reconciler
from capgate.gateway.tools.registry import ToolRegistry

if TYPE_CHECKING:
    import socket

__all__ = ["register", "run"]

_EXITS = [
    (EXIT_OK, "served until the client closed stdin (--stdio) or until SIGTERM (--http)"),
    (EXIT_ERROR, "error: bad configuration, catalogue, store, address or tenant; no OPA"),
]

_DESCRIPTION = """\
Serve the catalogue's tools over the Model Context Protocol. tools/list shows a
caller exactly the tools OPA composes for it; tools/call goes through the
gateway's execute decision (tools that need review are proposed, not run). The
caller's principal, task and environment come from --config: over stdio its
'stdio' binding, over HTTP the binding of the request's bearer token.

Over stdio (the default) an MCP client starts this command and talks on its
stdin and stdout; logs go to stderr. Over HTTP it listens on a loopback address
(127.0.0.1 or [::1]; port 0 picks a free one) at /mcp and prints the URL on
stderr. docs/mcp-server.md has the configuration format and client set-ups."""


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that OPA, the store and sockets close."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def register(sub: Actions) -> None:
    """Add ``serve`` to the ``capgate`` parser."""
    parser = sub.add_parser(
        "serve",
        help="serve the catalogue's tools over MCP (stdio or streamable HTTP)",
        description=_DESCRIPTION,
        epilog=exit_codes(_EXITS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--catalogue", type=Path, required=True, help="catalogue folder")
    parser.add_argument(
        "--store",
        metavar="URL",
        help=f"the gateway's store: a SQLite file path or postgresql://... (default: ${STORE_ENV})",
    )
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        metavar="FILE",
        help="who the callers are and where the tools come from (YAML or JSON)",
    )
    parser.add_argument(
        "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
    )
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="talk MCP on stdin and stdout (the default)"
    )
    transport.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp (loopback only)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning"],
        default="info",
        help="level of capgate's own log lines on stderr (default: info)",
    )
    parser.set_defaults(run=run)


class _OwnLevel(logging.Filter):
    """capgate's records from ``level`` up, everyone else's from WARNING up."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.startswith("capgate.")
        return record.levelno >= (self.level if ours else logging.WARNING)


def _logging(level: str) -> None:
    """Log lines on stderr (stdout is the MCP channel over stdio): capgate's at
    ``level``, every other library's at WARNING only."""
    number = logging.getLevelNamesMapping()[level.upper()]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OwnLevel(number))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(number, logging.WARNING))


def _upstreams(config: ServeConfig) -> list[ServerSpec]:
    """The configuration's ``upstreams``; without them, the ``MCP_SERVERS`` /
    ``MCP_ORACLE`` gate of the environment, as the library's default registry reads it."""
    configured = config.upstream_servers()
    if configured or config.upstreams is not None:
        return configured
    gate = servers_from_env(oracle=oracle_server_spec())
    if gate:
        print(
            f"capgate serve: upstream MCP servers from ${MCP_SERVERS_ENV} / "
            f"${MCP_ORACLE_ENV}: {', '.join(server.id for server in gate)}",
            file=sys.stderr,
        )
    return gate


def _check_bindings(config: ServeConfig, args: argparse.Namespace) -> None:
    if args.http is None and config.stdio is None:
        raise ConfigError(f"{args.config}: no 'stdio' binding, which --stdio needs")
    if args.http is not None and not config.http:
        raise ConfigError(f"{args.config}: no 'http' bindings, which --http needs")


def run(args: argparse.Namespace) -> int:
    try:
        import mcp  # noqa: F401 - the extra's presence, checked before anything starts
    except ImportError:
        raise InvalidInput(
            "capgate serve needs the mcp extra: pip install 'capgate[mcp]'"
        ) from None
    from capgate.adapters.fronts.mcp.http import loopback_socket, parse_listen_address

    _logging(args.log_level)
    config = load_config(args.config)
    _check_bindings(config, args)
    address = parse_listen_address(args.http) if args.http is not None else None
    registry = ToolRegistry(*config.adapters())
    upstreams = _upstreams(config)
    credentials = config.credential_resolver()
    catalogue = load_catalogue(args.catalogue)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with opened_store(args) as store, contextlib.ExitStack() as stack:
            with store.transaction(read_only=True) as tx:
                for binding in bindings_of(config):
                    if tx.get_tenant(binding.principal.tenant) is None:
                        raise UnknownTenant(binding.principal.tenant)
            # Bound before OPA starts: a port in use is an error at once.
            sock = stack.enter_context(loopback_socket(*address)) if address else None
            if upstreams:  # servers start at their first call, and stop with this command
                from capgate.adapters.tools.mcp import McpTools

                registry.attach(
                    stack.enter_context(McpTools(catalogue, upstreams, store, unplaced=True))
                )
            sidecar = stack.enter_context(PolicySidecar(catalogue, opa_url=args.opa))
            gateway = Gateway(catalogue, sidecar.client, registry, store, credentials=credentials)
            gateway.reconcile()
            stack.enter_context(Reconciler(gateway, config.reconcile_seconds))
            if sock is None:
                return _serve_stdio(gateway, config)
            return _serve_http(gateway, config, sock)
    except _Terminated:
        print("capgate serve: stopped (SIGTERM)", file=sys.stderr)
        return EXIT_OK
    except KeyboardInterrupt:
        print("capgate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve_stdio(gateway: Gateway, config: ServeConfig) -> int:
    import anyio
    from mcp.server.stdio import stdio_server

    from capgate.adapters.fronts.mcp.server import GatewayMCP

    assert config.stdio is not None
    service = GatewayMCP(
        gateway,
        stdio=config.stdio,
        poll_seconds=config.list_changed_poll_seconds,
        max_concurrent_calls=config.max_concurrent_calls,
        max_concurrent_decisions=config.max_concurrent_decisions,
    )

    async def serve() -> None:
        async with stdio_server() as (read, write):
            server = service.server
            await server.run(read, write, server.create_initialization_options())

    print("capgate serve: MCP over stdio", file=sys.stderr, flush=True)
    anyio.run(serve)
    return EXIT_OK


def _serve_http(gateway: Gateway, config: ServeConfig, sock: socket.socket) -> int:
    import anyio

    from capgate.adapters.fronts.mcp.http import serve_http
    from capgate.adapters.fronts.mcp.server import GatewayMCP

    service = GatewayMCP(
        gateway,
        http={binding.name: binding for binding in config.http},
        poll_seconds=config.list_changed_poll_seconds,
        max_concurrent_calls=config.max_concurrent_calls,
        max_concurrent_decisions=config.max_concurrent_decisions,
    )
    anyio.run(serve_http, service, config, sock)
    return EXIT_OK
