"""``capgate connections``: a tenant's connections to providers, kept by people.

Each change is one store transaction with its ``connection`` ledger row, naming who
made it (``--by``): an error leaves the store exactly as it was.

Revoking and restoring a connection go through
:meth:`capgate.Gateway.revoke_connection` and
:meth:`~capgate.Gateway.restore_connection`, the very calls a service makes, so
queued proposals that act through the connection are blocked in the same
transaction. Which proposals those are depends on each proposal's tool and the
connection its contract names, so these two commands need the catalogue
(``--catalogue``); they ask OPA nothing (a revocation only takes away, and every
later dispatch asks OPA with the connection's new status anyway), so no OPA is
started for them: the policy given to the gateway refuses to be asked.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from capgate.cli.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    STORE_EXITS,
    Actions,
    add_action,
    add_by,
    add_group,
    add_json,
    identifier,
    opened_store,
    operator,
    print_json,
    require_tenant,
    safe,
    table,
    when,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import (
    DuplicateRecord,
    InvalidInput,
    PolicyUnavailable,
    UnknownConnection,
    quote,
)
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, ReviewDecision
from capgate.gateway.model.facts import ComposeInput, ConnectionStatus, ExecuteInput, ReviewInput
from capgate.gateway.service.credentials import EnvironmentCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.records import (
    ConnectionRecord,
    LedgerEntry,
    ProposalRecord,
    ProposalStatus,
)
from capgate.gateway.state.store import Tx
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["register"]


def _connection_json(record: ConnectionRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _connections_list(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        require_tenant(tx, tenant)
        connections = list(tx.connections(tenant).values())
    if args.json:
        print_json([_connection_json(c) for c in connections])
        return EXIT_OK
    if not connections:
        print(f"(tenant {tenant} has no connections: add one with `capgate connections add`)")
        return EXIT_OK
    table(
        ["ALIAS", "STATUS", "ACCOUNT", "UPDATED"],
        [[c.alias, c.status.value, safe(c.account), when(c.updated_at)] for c in connections],
    )
    return EXIT_OK


def _account(value: str) -> str:
    if not 1 <= len(value) <= 256 or value != value.strip() or safe(value) != value:
        raise InvalidInput(
            f"--account: {quote(value)} is not a provider account (1 to 256 printable "
            "characters, no leading or trailing space), e.g. sales@acme.example"
        )
    return value


def _connections_add(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    alias = identifier(args.alias, "ALIAS")
    account = _account(args.account)
    by = operator(args.by)
    with opened_store(args) as store, store.transaction() as tx:
        require_tenant(tx, tenant)
        existing = tx.connections(tenant).get(alias)
        if existing is not None:
            raise DuplicateRecord(
                "connection",
                alias,
                f"tenant {quote(tenant)} has a connection {quote(alias)} already (status "
                f"{existing.status.value}): revoke or restore it with `capgate connections`",
            )
        record = tx.put_connection(tenant, alias, status=ConnectionStatus.ACTIVE, account=account)
        tx.append(
            LedgerEntry(
                kind="connection",
                tenant=tenant,
                principal=by,
                outcome=ConnectionStatus.ACTIVE.value,
                detail={"alias": alias, "account": account, "added": True},
            )
        )
    print(
        f"connection {tenant}/{alias} added: {record.status.value}, "
        f"account {safe(record.account)} (by {safe(by)})"
    )
    return EXIT_OK


def _connections_variable(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    alias = identifier(args.alias, "ALIAS")
    print(EnvironmentCredentials().variable(tenant, alias))
    return EXIT_OK


class _NoDecisions:
    """The policy of a gateway that only revokes and restores: it refuses to be asked.

    Those two steps decide nothing (every later compose and dispatch asks OPA with
    the connection's new status), so the command starts no OPA; if the gateway did
    ask, failing closed is the only safe answer.
    """

    def _refuse(self) -> PolicyUnavailable:
        return PolicyUnavailable("this command asks OPA nothing; no OPA was started")

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        raise self._refuse()

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        raise self._refuse()

    def review(self, facts: ReviewInput) -> ReviewDecision:
        raise self._refuse()


def _queued(tx: Tx, tenant: str) -> list[ProposalRecord]:
    return [
        *tx.list_proposals(tenant=tenant, status=ProposalStatus.PENDING),
        *tx.list_proposals(tenant=tenant, status=ProposalStatus.APPROVED),
    ]


def _connections_set(args: argparse.Namespace, status: ConnectionStatus) -> int:
    tenant = identifier(args.tenant, "TENANT")
    alias = identifier(args.alias, "ALIAS")
    by = operator(args.by)
    catalogue = load_catalogue(args.catalogue)
    with opened_store(args) as store:
        with store.transaction(read_only=True) as tx:
            require_tenant(tx, tenant)
            before = tx.connections(tenant).get(alias)
            if before is None:
                raise UnknownConnection(tenant, alias)
            queued = _queued(tx, tenant)
        gateway = Gateway(catalogue, _NoDecisions(), ToolRegistry(), store)
        if status is ConnectionStatus.REVOKED:
            record = gateway.revoke_connection(tenant, alias, by=by)
        else:
            record = gateway.restore_connection(tenant, alias, by=by)
        with store.transaction(read_only=True) as tx:
            now = {p.id: tx.get_proposal(p.id) for p in queued}
    blocked = [
        p
        for p in queued
        if (current := now.get(p.id)) is not None and current.status is ProposalStatus.BLOCKED
    ]
    unknown = [p for p in queued if p.tool not in catalogue.tools]
    if args.json:
        print_json(
            {
                "connection": _connection_json(record),
                "previous_status": before.status.value,
                "blocked": [p.id for p in blocked],
                "not_in_catalogue": [p.id for p in unknown],
            }
        )
        return EXIT_OK
    print(
        f"connection {tenant}/{alias} ({safe(record.account)}): {before.status.value} -> "
        f"{record.status.value} (by {safe(by)})"
    )
    if status is ConnectionStatus.REVOKED:
        print("  its tools are hidden from the next compose; every dispatch through it is denied")
        for proposal in blocked:
            print(f"  blocked proposal {proposal.id} ({proposal.tool}): connection_revoked")
        if not blocked:
            print("  no queued proposal acts through it")
    else:
        print("  proposals it blocked stay blocked: their facts changed; propose them again")
    if unknown:
        ids = ", ".join(p.id for p in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        print(
            f"  warning: {len(unknown)} queued proposal(s) name tools catalogue "
            f"{args.catalogue} lacks ({ids}): they were not looked at here; is it the "
            "service's catalogue?"
        )
    return EXIT_OK


def _connections_revoke(args: argparse.Namespace) -> int:
    return _connections_set(args, ConnectionStatus.REVOKED)


def _connections_restore(args: argparse.Namespace) -> int:
    return _connections_set(args, ConnectionStatus.ACTIVE)


def register(sub: Actions) -> None:
    """Add ``connections`` to the ``capgate`` parser."""
    connections = add_group(
        sub,
        "connections",
        "list, add, revoke and restore a tenant's connections",
        "A tenant's connections to providers, by alias: status (active, disabled, "
        "revoked) and the provider account each acts as. The secret behind a connection "
        "is never stored: a credential resolver turns (tenant, alias) into it at dispatch; "
        "with `credentials: environment` (capgate serve's default) it is the environment "
        "variable that `capgate connections variable TENANT ALIAS` prints.",
        STORE_EXITS,
    )
    listing = add_action(connections, "list", "list a tenant's connections", _connections_list)
    listing.add_argument("tenant", metavar="TENANT")
    add_json(listing, "the connections")

    add = add_action(connections, "add", "add an active connection", _connections_add)
    add.add_argument("tenant", metavar="TENANT")
    add.add_argument("alias", metavar="ALIAS", help="the alias tool contracts name")
    add.add_argument(
        "--account", required=True, help="the provider account it acts as, e.g. sales@acme.example"
    )
    add_by(add)

    variable = add_action(
        connections,
        "variable",
        "print the environment variable holding a connection's secret",
        _connections_variable,
        exits=((EXIT_OK, "success"), (EXIT_ERROR, "error: TENANT or ALIAS is not a name")),
        description="Print the environment variable that `credentials: environment` (capgate "
        "serve's default, gateway.EnvironmentCredentials) reads the connection's secret "
        "from: CAPGATE_SECRET_<TENANT>__<ALIAS>, where a name of lower-case letters and "
        "digits with single inner _ is upper-cased (acme, sales_mailbox: "
        "CAPGATE_SECRET_ACME__SALES_MAILBOX) and any other is _ and the upper-case hex of "
        "its UTF-8 bytes (acme-eu, crm: CAPGATE_SECRET__61636D652D6575__CRM). Reads no "
        "store and no secret: the tenant and the connection need not exist yet.",
        store=False,
    )
    variable.add_argument("tenant", metavar="TENANT")
    variable.add_argument("alias", metavar="ALIAS")

    for name, run, what in (
        (
            "revoke",
            _connections_revoke,
            "revoke a connection: its tools vanish from the next compose, and queued "
            "proposals acting through it are blocked (connection_revoked)",
        ),
        (
            "restore",
            _connections_restore,
            "make a revoked or disabled connection active again (blocked proposals stay blocked)",
        ),
    ):
        action = add_action(connections, name, what, run)
        action.add_argument("tenant", metavar="TENANT")
        action.add_argument("alias", metavar="ALIAS")
        action.add_argument(
            "--catalogue",
            type=Path,
            required=True,
            metavar="DIR",
            help="the service's catalogue: which tools act through which connection",
        )
        add_by(action, required=True)
        add_json(action, "the result")
