"""``capgate tenants``: add and list the gateway's tenants, kept by people.

Adding a tenant is one store transaction with its ``tenant`` ledger row, naming who
made it (``--by``): an error leaves the store exactly as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from capgate.cli.commands.budget import budget_json, units
from capgate.cli.commands.common import (
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
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import DuplicateRecord, InvalidInput, quote
from capgate.gateway.state.records import LedgerEntry

__all__ = ["register"]


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
        f"limit {units(record.budget_limit)} (by {safe(by)})"
    )
    return EXIT_OK


def _tenants_list(args: argparse.Namespace) -> int:
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        found = [
            (record, tx.budget(record.tenant), tx.connections(record.tenant))
            for record in tx.tenants()
        ]
    if args.json:
        print_json(
            [
                {
                    **record.model_dump(mode="json"),
                    "budget": budget_json(budget),
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
                units(budget.limit),
                str(budget.reserved),
                str(budget.spent),
                units(budget.remaining),
                ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none",
            ]
        )
    table(
        ["TENANT", "BUDGET CLASS", "LIMIT", "RESERVED", "SPENT", "REMAINING", "CONNECTIONS"],
        rows,
    )
    return EXIT_OK


def register(sub: Actions) -> None:
    """Add ``tenants`` to the ``capgate`` parser."""
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
