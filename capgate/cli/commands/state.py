"""``capgate tenants``, ``capgate connections``, ``capgate budget``: the tenant facts
the gateway decides with, kept by people.

Each change is one store transaction with its ledger row (``tenant``,
``connection``, ``budget``), naming who made it (``--by``): an error leaves the
store exactly as it was.

Revoking and restoring a connection go through
:meth:`gateway.Gateway.revoke_connection` and
:meth:`~gateway.Gateway.restore_connection`, the very calls a service makes, so
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
    amount,
    identifier,
    opened_store,
    operator,
    print_json,
    safe,
    table,
    when,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import (
    DuplicateRecord,
    InvalidInput,
    PolicyUnavailable,
    StoreError,
    UnknownConnection,
    UnknownTenant,
    quote,
)
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, ReviewDecision
from capgate.gateway.model.facts import ComposeInput, ConnectionStatus, ExecuteInput, ReviewInput
from capgate.gateway.service.credentials import EnvironmentCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.records import (
    BudgetState,
    ConnectionRecord,
    LedgerEntry,
    ProposalRecord,
    ProposalStatus,
    TenantRecord,
)
from capgate.gateway.state.sql import SqlTx
from capgate.gateway.state.store import Tx
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["register", "require_tenant", "tenant_records"]


# -- reading --------------------------------------------------------------------------------


def tenant_records(tx: Tx) -> list[TenantRecord]:
    """Every tenant, by name.

    The store protocol has no listing of tenants (only ``get_tenant``), so this
    reads the one table both SQL backends share, read-only, through the SQL
    transaction. To be replaced by ``Tx.tenants()`` when the store has one.
    """
    if not isinstance(tx, SqlTx):
        raise StoreError("this store cannot list its tenants")
    rows = tx._rows("SELECT tenant FROM tenants ORDER BY tenant")
    records = [tx.get_tenant(str(row["tenant"])) for row in rows]
    return [record for record in records if record is not None]


def require_tenant(tx: Tx, tenant: str) -> TenantRecord:
    record = tx.get_tenant(tenant)
    if record is None:
        raise UnknownTenant(tenant)
    return record


def _units(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def _budget_line(state: BudgetState) -> str:
    whose = f"task {state.task_id}" if state.task_id else "tenant"
    return (
        f"{whose} budget: limit {_units(state.limit)}, reserved {state.reserved}, "
        f"spent {state.spent}, remaining {_units(state.remaining)}"
    )


def _budget_json(state: BudgetState) -> dict[str, Any]:
    return {**state.model_dump(mode="json"), "remaining": state.remaining}


# -- tenants --------------------------------------------------------------------------------


def _tenants_add(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    budget_class = identifier(args.budget_class, "--budget-class")
    limit = None if args.budget_limit is None else amount(args.budget_limit, "--budget-limit")
    by = operator(args.by)
    if args.catalogue is not None:
        classes = load_catalogue(args.catalogue).budget_classes
        if budget_class not in classes:
            raise InvalidInput(
                f"--budget-class: {quote(budget_class)} is not a budget class of catalogue "
                f"{args.catalogue} (it has: {', '.join(sorted(classes))})"
            )
    with opened_store(args, create=True) as store, store.transaction() as tx:
        if tx.get_tenant(tenant) is not None:
            raise DuplicateRecord(
                "tenant",
                tenant,
                f"tenant {quote(tenant)} exists already (change its limit with "
                "`capgate budget set`)",
            )
        record = tx.put_tenant(tenant, budget_class=budget_class, budget_limit=limit)
        tx.append(
            LedgerEntry(
                kind="tenant",
                tenant=tenant,
                principal=by,
                outcome="added",
                detail={"budget_class": budget_class, "budget_limit": limit},
            )
        )
    print(
        f"tenant {record.tenant} added: budget class {record.budget_class}, "
        f"limit {_units(record.budget_limit)} (by {safe(by)})"
    )
    return EXIT_OK


def _tenants_list(args: argparse.Namespace) -> int:
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        found = [
            (record, tx.budget(record.tenant), tx.connections(record.tenant))
            for record in tenant_records(tx)
        ]
    if args.json:
        print_json(
            [
                {
                    **record.model_dump(mode="json"),
                    "budget": _budget_json(budget),
                    "connections": {alias: c.status.value for alias, c in connections.items()},
                }
                for record, budget, connections in found
            ]
        )
        return EXIT_OK
    if not found:
        print("(no tenants: add one with `capgate tenants add`)")
        return EXIT_OK
    rows = []
    for record, budget, connections in found:
        counts: dict[str, int] = {}
        for connection in connections.values():
            counts[connection.status.value] = counts.get(connection.status.value, 0) + 1
        rows.append(
            [
                record.tenant,
                record.budget_class,
                _units(budget.limit),
                str(budget.reserved),
                str(budget.spent),
                _units(budget.remaining),
                ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none",
            ]
        )
    table(
        ["TENANT", "BUDGET CLASS", "LIMIT", "RESERVED", "SPENT", "REMAINING", "CONNECTIONS"],
        rows,
    )
    return EXIT_OK


# -- connections ------------------------------------------------------------------------------


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


# -- budget -------------------------------------------------------------------------------------


def _budget_show(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    task = None if args.task is None else identifier(args.task, "--task")
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        record = require_tenant(tx, tenant)
        state = tx.budget(tenant, task)
    own = task is None or state.task_id is not None
    if args.json:
        print_json(
            {
                **_budget_json(state),
                "budget_class": record.budget_class,
                "task": task,
                "applies": "task" if task is not None and own else "tenant",
            }
        )
        return EXIT_OK
    print(f"tenant {tenant} (budget class {record.budget_class})")
    if not own:
        print(f"  task {task} has no limit of its own: the tenant's budget applies")
    print(f"  {_budget_line(state)}")
    return EXIT_OK


def _budget_set(args: argparse.Namespace) -> int:
    tenant = identifier(args.tenant, "TENANT")
    task = None if args.task is None else identifier(args.task, "--task")
    if (args.limit is None) == (not args.unlimited):
        raise InvalidInput("give either LIMIT (cost units) or --unlimited, not both or neither")
    limit = None if args.unlimited else amount(args.limit, "LIMIT")
    by = operator(args.by)
    with opened_store(args) as store, store.transaction() as tx:
        require_tenant(tx, tenant)
        before = tx.budget(tenant, task)
        previous = before.limit if task is None or before.task_id is not None else None
        if task is None:
            tx.set_budget_limit(tenant, limit)
        else:
            tx.set_task_budget(tenant, task, limit)
        after = tx.budget(tenant, task)
        tx.append(
            LedgerEntry(
                kind="budget",
                tenant=tenant,
                principal=by,
                outcome="set",
                detail={"task": task, "limit": limit, "previous_limit": previous},
            )
        )
    whose = f"tenant {tenant}" if task is None else f"task {task} of tenant {tenant}"
    print(f"budget of {whose}: limit {_units(previous)} -> {_units(limit)} (by {safe(by)})")
    if task is not None and limit is None:
        print("  the task has no limit of its own now: the tenant's budget applies")
    print(f"  {_budget_line(after)}")
    if after.remaining is not None and after.remaining < 0:
        print("  remaining is below zero: no call runs until the limit is raised")
    return EXIT_OK


# -- the parsers ----------------------------------------------------------------------------------


def register(sub: Actions) -> None:
    """Add ``tenants``, ``connections`` and ``budget`` to the ``capgate`` parser."""
    _register_tenants(sub)
    _register_connections(sub)
    _register_budget(sub)


def _register_tenants(sub: Actions) -> None:
    tenants = add_group(
        sub,
        "tenants",
        "add and list the gateway's tenants",
        "Tenants of the gateway's store: each has a budget class (which cost classes "
        "its agents may see) and a budget limit (cost units its calls may spend).",
        STORE_EXITS,
    )
    add = add_action(
        tenants, "add", "add a tenant (creates a SQLite store if there is none)", _tenants_add
    )
    add.add_argument("tenant", metavar="TENANT")
    add.add_argument(
        "--budget-class",
        required=True,
        metavar="NAME",
        help="the tenant's budget class (a compose fact)",
    )
    add.add_argument(
        "--budget-limit",
        metavar="N",
        help="cost units its calls may spend in all (default: no limit)",
    )
    add.add_argument(
        "--catalogue",
        type=Path,
        metavar="DIR",
        help="check that the budget class is one of this catalogue's",
    )
    add_by(add)

    listing = add_action(
        tenants, "list", "list tenants with their budgets and connections", _tenants_list
    )
    add_json(listing, "the tenants")


def _register_connections(sub: Actions) -> None:
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


def _register_budget(sub: Actions) -> None:
    budget = add_group(
        sub,
        "budget",
        "show and set a tenant's (or a task's) budget",
        "Budgets in cost units. Each call reserves its contract's cost before it runs "
        "and settles it after; a task may have a limit of its own besides the tenant's.",
        STORE_EXITS,
    )
    show = add_action(budget, "show", "show a tenant's budget, or a task's", _budget_show)
    show.add_argument("tenant", metavar="TENANT")
    show.add_argument("--task", metavar="TASK", help="the task's own budget, if it has one")
    add_json(show, "the budget")

    update = add_action(
        budget,
        "set",
        "set a tenant's budget limit, or a task's (reservations and spending are kept)",
        _budget_set,
    )
    update.add_argument("tenant", metavar="TENANT")
    update.add_argument("limit", metavar="LIMIT", nargs="?", help="cost units")
    update.add_argument(
        "--unlimited",
        action="store_true",
        help="no limit (for --task: the tenant's budget alone applies)",
    )
    update.add_argument("--task", metavar="TASK", help="set this task's own limit")
    add_by(update)
