"""``capgate budget``: show and set a tenant's (or a task's) budget, kept by people.

A change is one store transaction with its ``budget`` ledger row, naming who made
it (``--by``): an error leaves the store exactly as it was. The rendering of a
budget's state lives here too, since ``capgate tenants list`` prints the same.
"""

from __future__ import annotations

import argparse
from typing import Any

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
    require_tenant,
    safe,
)
from capgate.gateway.errors import InvalidInput
from capgate.gateway.state.records import BudgetState, LedgerEntry

__all__ = ["budget_json", "budget_line", "register", "units"]


def units(value: int | None) -> str:
    """A limit for people: a number of cost units, or "unlimited"."""
    return "unlimited" if value is None else str(value)


def budget_line(state: BudgetState) -> str:
    """One line of a budget's state, as `tenants list` and `budget` print it."""
    whose = f"task {state.task_id}" if state.task_id else "tenant"
    return (
        f"{whose} budget: limit {units(state.limit)}, reserved {state.reserved}, "
        f"spent {state.spent}, remaining {units(state.remaining)}"
    )


def budget_json(state: BudgetState) -> dict[str, Any]:
    """A budget's state for --json, with what remains (a derived field) spelled out."""
    return {**state.model_dump(mode="json"), "remaining": state.remaining}


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
                **budget_json(state),
                "budget_class": record.budget_class,
                "task": task,
                "applies": "task" if task is not None and own else "tenant",
            }
        )
        return EXIT_OK
    print(f"tenant {tenant} (budget class {record.budget_class})")
    if not own:
        print(f"  task {task} has no limit of its own: the tenant's budget applies")
    print(f"  {budget_line(state)}")
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
    print(f"budget of {whose}: limit {units(previous)} -> {units(limit)} (by {safe(by)})")
    if task is not None and limit is None:
        print("  the task has no limit of its own now: the tenant's budget applies")
    print(f"  {budget_line(after)}")
    if after.remaining is not None and after.remaining < 0:
        print("  remaining is below zero: no call runs until the limit is raised")
    return EXIT_OK


def register(sub: Actions) -> None:
    """Add ``budget`` to the ``capgate`` parser."""
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
