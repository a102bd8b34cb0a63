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
then, whether or not any agent calls again. Unless ``--no-worker`` is given, an
execution worker (:class:`capgate.gateway.service.worker.Worker`) dispatches the
approved proposals while it serves; ``capgate worker`` (:mod:`capgate.cli.worker`)
runs one alone. Over HTTP, ``/healthz`` and ``/readyz`` answer beside ``/mcp``
(:mod:`capgate.adapters.fronts.mcp.probes`): the readiness of the sidecar, the store
and that worker. With a ``notices`` section, a notifier sends each proposal's steps
to its tenant's webhook, signed (:mod:`capgate.gateway.service.notices`). What the two
commands build alike is :mod:`capgate.cli.service`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from capgate.adapters.fronts.mcp.config import HttpBinding, ServeConfig, bindings_of, load_config
from capgate.cli.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    Actions,
    opa_option,
    warn_undeclared,
)
from capgate.cli.logs import configure_logging
from capgate.cli.service import (
    add_log_level,
    command_parser,
    parts_of,
    readiness_of,
    run_until_stopped,
    start_gateway,
    start_notifier,
    start_worker,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import ConfigError, InvalidInput, UnknownTenant, quote
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.store import Store

if TYPE_CHECKING:
    import socket

    from capgate.adapters.fronts.metrics import GatewayMetrics
    from capgate.gateway.model.contracts import Catalogue
    from capgate.gateway.service.health import Readiness

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
stderr. While it serves, an execution worker dispatches the proposals reviewers
approve (--no-worker: leave that to `capgate worker`). docs/mcp-server.md has
the configuration format and client set-ups."""


def register(sub: Actions) -> None:
    """Add ``serve`` to the ``capgate`` parser."""
    parser = command_parser(
        sub,
        "serve",
        help="serve the catalogue's tools over MCP (stdio or streamable HTTP)",
        description=_DESCRIPTION,
        exits=_EXITS,
        config="who the callers are and where the tools come from (YAML or JSON)",
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
        "--no-worker",
        dest="worker",
        action="store_false",
        help="do not dispatch approved proposals in this process (run `capgate worker`)",
    )
    add_log_level(parser)
    parser.set_defaults(run=run)


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

    configure_logging(args.log_level, args.log_format)
    config = load_config(args.config)
    _check_bindings(config, args)
    # The people's key set read now, so an unreadable or unsafe one stops the start.
    config.people_directory()
    address = parse_listen_address(args.http) if args.http is not None else None
    parts = parts_of(config, "serve")
    catalogue = load_catalogue(args.catalogue)
    for binding in bindings_of(config):
        # A typo in a binding gives its caller an empty tool list: say so now.
        name = binding.name if isinstance(binding, HttpBinding) else "stdio"
        warn_undeclared(
            catalogue,
            binding.principal.role,
            binding.task.type,
            binding.environment,
            where=f"{args.config}: binding {quote(name)}: ",
        )

    def serve(store: Store, stack: contextlib.ExitStack) -> int:
        with store.transaction(read_only=True) as tx:
            for binding in bindings_of(config):
                if tx.get_tenant(binding.principal.tenant) is None:
                    raise UnknownTenant(binding.principal.tenant)
            for tenant in sorted(
                {p.tenant for p in config.people} | {o.tenant for o in config.operators}
            ):
                if tx.get_tenant(tenant) is None:
                    raise UnknownTenant(tenant)
        # Bound before OPA starts: a port in use is an error at once.
        sock = stack.enter_context(loopback_socket(*address)) if address else None
        metrics = _metrics(config, catalogue, store) if sock is not None else None
        started = start_gateway(
            stack,
            parts,
            catalogue,
            store,
            opa_url=opa_option(args),
            observers=[metrics.observe] if metrics is not None else [],
            on_exchange=metrics.exchange if metrics is not None else None,
            on_step=metrics.step if metrics is not None else None,
        )
        if metrics is not None:
            metrics.watch_opa(started.sidecar.readiness)
        worker = start_worker(stack, started.gateway, config) if args.worker else None
        start_notifier(stack, store, config)
        if sock is None:
            return _serve_stdio(started.gateway, config)
        readiness = readiness_of(started, worker, config)
        return _serve_http(started.gateway, config, sock, readiness, metrics)

    return run_until_stopped(args, "serve", serve)


def _metrics(config: ServeConfig, catalogue: Catalogue, store: Store) -> GatewayMetrics | None:
    """The metrics the configuration asks for (``metrics:``), or None."""
    if config.metrics is None:
        return None
    try:
        from capgate.adapters.fronts.metrics import GatewayMetrics
    except ImportError:
        raise InvalidInput(
            "the configuration's metrics: section needs the metrics extra: "
            "pip install 'capgate[metrics]'"
        ) from None
    from capgate.gateway.opa.declarations import declared_codes

    return GatewayMetrics(
        catalogue,
        store,
        reason_codes=declared_codes(),
        tenant_labels=config.metrics.tenant_labels,
    )


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
        await_seconds=config.await_review_seconds,
    )

    async def serve() -> None:
        async with stdio_server() as (read, write):
            server = service.server
            await server.run(read, write, server.create_initialization_options())

    print("capgate serve: MCP over stdio", file=sys.stderr, flush=True)
    anyio.run(serve)
    return EXIT_OK


def _serve_http(
    gateway: Gateway,
    config: ServeConfig,
    sock: socket.socket,
    readiness: Readiness,
    metrics: GatewayMetrics | None,
) -> int:
    import anyio

    from capgate.adapters.fronts.mcp.http import serve_http
    from capgate.adapters.fronts.mcp.server import GatewayMCP

    service = GatewayMCP(
        gateway,
        http={binding.name: binding for binding in config.http},
        poll_seconds=config.list_changed_poll_seconds,
        max_concurrent_calls=config.max_concurrent_calls,
        max_concurrent_decisions=config.max_concurrent_decisions,
        await_seconds=config.await_review_seconds,
    )
    anyio.run(serve_http, service, config, sock, readiness, metrics)
    return EXIT_OK
