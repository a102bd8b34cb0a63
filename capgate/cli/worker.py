"""``capgate worker``: the execution worker alone, for deployments that run it apart.

``capgate serve`` runs a worker itself (unless ``--no-worker``); this command runs
only that: it dispatches the approved proposals of the store with the facts of their
moment (:class:`capgate.gateway.service.worker.Worker`), and reconciles as ``serve``
does, until SIGTERM or Ctrl-C. It reads the same configuration file as ``serve``
and builds the same gateway from it (:mod:`capgate.cli.service`): the ``tools``
adapters and ``upstreams`` that run the execution actions, the ``credentials`` that
resolve their secrets, ``lease_seconds``, ``reconcile_seconds``, the ``worker``
section and the ``notices`` section (a notifier of signed webhooks, as ``serve``
runs one); the file's bindings (who agents are) are not used. Any number of workers,
in any number of processes and hosts, may share one store: each proposal is claimed
by one of them at a time, and sent at most once whatever happens to them.

Stopping (SIGTERM: exit status 0; Ctrl-C: 130) stops claiming, waits up to
``worker.stop_seconds`` for the dispatches under way to end, and exits; a dispatch
still running then is taken over by another worker once its claim and its
operation's lease are over, and looked up before anything is sent again.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading

from capgate.adapters.fronts.mcp.config import load_config
from capgate.cli.commands.common import EXIT_ERROR, EXIT_OK, Actions, opa_option
from capgate.cli.logs import configure_logging
from capgate.cli.service import (
    add_log_level,
    command_parser,
    parts_of,
    run_until_stopped,
    start_gateway,
    start_notifier,
    start_worker,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.state.store import Store

__all__ = ["register", "run"]

_EXITS = [
    (EXIT_OK, "stopped by SIGTERM, having finished (or given back) the work under way"),
    (EXIT_ERROR, "error: bad configuration, catalogue or store; no OPA"),
]

_DESCRIPTION = """\
Dispatch the proposals reviewers approve, with the facts of the moment: OPA is
asked again at each dispatch (a connection revoked or an approval expired
since blocks the proposal), retryable outcomes are tried again with backoff,
and each proposal is sent at most once however many workers share the store.
`capgate serve` runs a worker itself; run this for a deployment that keeps
them apart. --config is serve's file: its tools, upstreams, credentials,
lease_seconds, reconcile_seconds, worker and notices settings (its bindings
are not used). Logs go to stderr. docs/lifecycle.md describes the worker,
docs/notices.md the notices."""


def register(sub: Actions) -> None:
    """Add ``worker`` to the ``capgate`` parser."""
    parser = command_parser(
        sub,
        "worker",
        help="dispatch approved proposals (the execution worker, apart from serve)",
        description=_DESCRIPTION,
        exits=_EXITS,
        config="capgate serve's configuration: tools, upstreams, credentials, worker settings",
    )
    add_log_level(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    config = load_config(args.config)
    parts = parts_of(config, "worker")
    catalogue = load_catalogue(args.catalogue)

    def work(store: Store, stack: contextlib.ExitStack) -> int:
        started = start_gateway(stack, parts, catalogue, store, opa_url=opa_option(args))
        worker = start_worker(stack, started.gateway, config)
        start_notifier(stack, store, config)
        print(f"capgate worker: {worker.name} on {store.location}", file=sys.stderr, flush=True)
        forever = threading.Event()
        while not forever.wait(3600):  # until SIGTERM or Ctrl-C raises here
            pass
        return EXIT_OK  # pragma: no cover - the loop above ends by a signal only

    return run_until_stopped(args, "worker", work)
