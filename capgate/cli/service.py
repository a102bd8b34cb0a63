"""What ``capgate serve`` and ``capgate worker`` share: a gateway that runs for a while.

Both commands read one configuration file (:mod:`capgate.adapters.fronts.mcp.config`)
and build the gateway from it the same way, here, so that a deployment that runs
them apart gives both the same tools and credentials: the ``tools`` adapters, the
upstream MCP servers (``upstreams``, or the ``MCP_SERVERS`` / ``MCP_ORACLE`` gate of
the environment), the ``credentials`` resolver, the operation lease
(``lease_seconds``), OPA (embedded, or ``--opa``/``$CAPGATE_OPA_URL``; the sidecar is
kept beside the gateway, in :class:`Started`, for ``serve``'s readiness), a reconcile
at start and every ``reconcile_seconds``, the execution worker (``worker``), and the
notifier of signed webhook notices (``notices``, when the file has that section).
Each command keeps its own order of start-up around these (``serve`` binds its
socket before OPA starts); SIGTERM becomes :class:`Terminated` in the main thread,
so everything entered on the command's :class:`~contextlib.ExitStack` closes in
order (the worker first finishing, or giving back, what it holds). A second SIGTERM
(or Ctrl-C) while that goes on stops at once.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from capgate.adapters.fronts.mcp.config import ServeConfig
from capgate.adapters.tools.mcp.config import (
    MCP_ORACLE_ENV,
    MCP_SERVERS_ENV,
    ServerSpec,
    servers_from_env,
)
from capgate.cli.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    STORE_ENV,
    Actions,
    ExitRows,
    exit_codes,
    opened_store,
)
from capgate.cli.logs import log_decision
from capgate.demo.oracle_server import oracle_server_spec
from capgate.gateway.enforce.dispatcher import DecisionEvent, Observer
from capgate.gateway.errors import InvalidInput
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.sidecar import PolicySidecar, opa_address
from capgate.gateway.policy.address import OPAAddress
from capgate.gateway.policy.client import Exchange
from capgate.gateway.service.credentials import CredentialResolver
from capgate.gateway.service.fixtures import check_fixtures
from capgate.gateway.service.gateway import Gateway, StepTiming
from capgate.gateway.service.health import Readiness, store_check, worker_check
from capgate.gateway.service.notices.notifier import Notifier
from capgate.gateway.service.recovery import Reconciler
from capgate.gateway.service.versions import pin_contracts
from capgate.gateway.service.worker import Worker, WorkerEvent
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry

__all__ = [
    "Parts",
    "Started",
    "Terminated",
    "add_log_level",
    "command_parser",
    "parts_of",
    "readiness_of",
    "run_until_stopped",
    "start_gateway",
    "start_notifier",
    "start_worker",
]


def command_parser(
    sub: Actions, name: str, *, help: str, description: str, exits: ExitRows, config: str
) -> argparse.ArgumentParser:
    """The command's parser with what both take first: ``--catalogue``, ``--store``,
    ``--config`` (``config`` says what the command reads from it) and ``--opa``."""
    parser = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=exit_codes(exits),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--catalogue", type=Path, required=True, help="catalogue folder")
    parser.add_argument(
        "--store",
        metavar="URL",
        help=f"the gateway's store: a SQLite file path or postgresql://... (default: ${STORE_ENV})",
    )
    parser.add_argument("--config", type=Path, required=True, metavar="FILE", help=config)
    parser.add_argument(
        "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
    )
    return parser


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning"],
        default="info",
        help="level of capgate's own log lines on stderr (default: info)",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text lines, or JSON lines of one schema (docs/operations.md); default: text",
    )


class Terminated(Exception):
    """SIGTERM, turned into an exception so that OPA, the store and sockets close."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def run_until_stopped(
    args: argparse.Namespace, command: str, body: Callable[[Store, contextlib.ExitStack], int]
) -> int:
    """Open the store, run ``body`` with it and an exit stack, close both in order.

    SIGTERM stops it with exit status 0, Ctrl-C with 130; either way, everything
    ``body`` entered on the stack is closed first (the worker stopping gracefully)."""
    try:
        with (
            _terminated_by_sigterm(),
            opened_store(args) as store,
            contextlib.ExitStack() as stack,
        ):
            return body(store, stack)
    except Terminated:
        print(f"capgate {command}: stopped (SIGTERM)", file=sys.stderr)
        return EXIT_OK
    except KeyboardInterrupt:
        print("capgate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _terminated_by_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while inside."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class Parts:
    """What the configuration names, built before anything starts."""

    config: ServeConfig
    registry: ToolRegistry
    upstreams: list[ServerSpec]
    credentials: CredentialResolver


def _upstreams(config: ServeConfig, command: str) -> list[ServerSpec]:
    """The configuration's ``upstreams``; without them, the ``MCP_SERVERS`` /
    ``MCP_ORACLE`` gate of the environment, as the library's default registry reads it."""
    configured = config.upstream_servers()
    if configured or config.upstreams is not None:
        return configured
    gate = servers_from_env(oracle=oracle_server_spec())
    if gate:
        print(
            f"capgate {command}: upstream MCP servers from ${MCP_SERVERS_ENV} / "
            f"${MCP_ORACLE_ENV}: {', '.join(server.id for server in gate)}",
            file=sys.stderr,
        )
    return gate


def parts_of(config: ServeConfig, command: str) -> Parts:
    """The adapters (imported and made now), the upstream servers and the resolver;
    the notices' secrets are looked for now too, so a missing one stops the command
    before OPA or the store is touched."""
    if config.notices is not None:
        for tenant, hook in config.notices.tenants.items():
            hook.secret(tenant)
    registry = ToolRegistry(*config.adapters())
    upstreams = _upstreams(config, command)
    return Parts(config, registry, upstreams, config.credential_resolver())


@dataclass(frozen=True)
class Started:
    """A running gateway and the OPA sidecar it asks (whose readiness a probe reports)."""

    gateway: Gateway
    sidecar: PolicySidecar


def start_gateway(
    stack: contextlib.ExitStack,
    parts: Parts,
    catalogue: Catalogue,
    store: Store,
    *,
    opa_url: OPAAddress | None,
    observers: Sequence[Observer] = (),
    on_exchange: Callable[[Exchange], None] | None = None,
    on_step: Callable[[StepTiming], None] | None = None,
) -> Started:
    """Pin the catalogue's contract versions (:mod:`capgate.gateway.service.versions`),
    attach the upstream servers, start OPA, ask it the catalogue's fixtures
    (:func:`~capgate.gateway.service.fixtures.check_fixtures`), build the gateway,
    reconcile what a previous process left open, and keep reconciling; all closed
    with ``stack``.
    Each decision is logged, and told to ``observers`` (the metrics), as are each
    round trip to OPA (``on_exchange``) and each step's time (``on_step``)."""
    # Before anything starts: a contract changed under a version the store has served
    # stops the start here, naming the version to give it. The new versions are pinned
    # once the fixtures hold (below): a start that fails pins nothing.
    pin_contracts(store, catalogue, check_only=True)
    if parts.upstreams:  # servers start at their first call, and stop with the stack
        try:
            from capgate.adapters.tools.mcp import McpTools
        except ImportError:
            raise InvalidInput(
                "upstream MCP servers need the mcp extra: pip install 'capgate[mcp]'"
            ) from None
        parts.registry.attach(
            stack.enter_context(McpTools(catalogue, parts.upstreams, store, unplaced=True))
        )
    tracing = parts.config.opa_tracing
    external = opa_address(opa_url)  # --opa, else $CAPGATE_OPA_URL, else None
    if tracing is not None and external is not None:
        raise InvalidInput(
            f"opa_tracing: in the configuration sets up the OPA capgate starts, but "
            f"{external.describe()} is used; set distributed_tracing in that OPA's own "
            "configuration instead (docs/operations.md)"
        )
    sidecar = stack.enter_context(
        PolicySidecar(
            catalogue,
            opa_url=opa_url,
            opa_tracing=tracing.tracing() if tracing is not None else None,
            on_exchange=on_exchange,
        )
    )
    # The catalogue's own representative calls (fixtures.yaml), asked of the OPA that
    # is about to serve: one that does not get its decision stops the start.
    check_fixtures(catalogue, sidecar.client, datetime.now(UTC))
    pin_contracts(store, catalogue)
    gateway = Gateway(
        catalogue,
        sidecar.client,
        parts.registry,
        store,
        credentials=parts.credentials,
        lease=parts.config.lease,
        observer=_each(log_decision, *observers),
        on_step=on_step,
    )
    gateway.reconcile()
    stack.enter_context(Reconciler(gateway, parts.config.reconcile_seconds))
    return Started(gateway, sidecar)


def readiness_of(started: Started, worker: Worker | None, config: ServeConfig) -> Readiness:
    """What ``/readyz`` reports: the sidecar's own check, the store's schema, and the
    worker (passing when this process runs none), within ``readiness_timeout_seconds``."""
    store = started.gateway.store
    return Readiness(
        {
            "opa": started.sidecar.readiness,
            "store": lambda: store_check(store),
            "worker": lambda: worker_check(worker),
        },
        timeout=config.readiness_timeout_seconds,
    )


def _each(*observers: Observer) -> Observer:
    def observe(event: DecisionEvent) -> None:
        for observer in observers:
            observer(event)

    return observe if len(observers) > 1 else observers[0]


def start_worker(
    stack: contextlib.ExitStack,
    gateway: Gateway,
    config: ServeConfig,
    *,
    on_event: Callable[[WorkerEvent], None] | None = None,
) -> Worker:
    """The execution worker of ``config.worker``, stopped (gracefully) with ``stack``;
    ``on_event`` hears what it did (where notices of dispatched and blocked attach)."""
    return stack.enter_context(Worker(gateway, config.worker, on_event=on_event))


def start_notifier(
    stack: contextlib.ExitStack, store: Store, config: ServeConfig
) -> Notifier | None:
    """The notifier of ``config.notices`` (None without that section), stopped with
    ``stack``. Its secrets are read from the environment now: a missing one is an
    error before anything is served. Every serve and worker process of a deployment
    may run one: each tenant's notices are sent by one of them at a time."""
    if config.notices is None:
        return None
    notifier = stack.enter_context(Notifier(store, config.notices))
    print(
        f"capgate: notices for {config.notices.describe()} ({notifier.name})",
        file=sys.stderr,
        flush=True,
    )
    return notifier
