"""``capgate tasks``: the resources linked to a task, kept by the gateway.

A link is a fact with an author and a time (``--by``), written with its
``task_link`` ledger row in one transaction through
:mod:`capgate.gateway.service.links`, the calls a service makes: an error leaves the
store as it was. Linking what is linked already, or unlinking what is not, changes
nothing, says so, and is recorded. These commands ask OPA nothing: an operator's
link is the operator's act.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from capgate.cli.commands.common import (
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
from capgate.gateway.model.facts import ResourceRef
from capgate.gateway.service.links import (
    link_resource,
    resource_ref,
    task_links,
    unlink_resource,
)
from capgate.gateway.state.records import TaskLinkRecord
from capgate.gateway.state.store import Store

__all__ = ["register"]

_T = TypeVar("_T")


def _json(link: TaskLinkRecord) -> dict[str, Any]:
    return link.model_dump(mode="json")


def _in_tenant(args: argparse.Namespace, act: Callable[[Store, str, str], _T]) -> _T:
    """``act(store, tenant, task)`` on the store named, for a tenant it holds."""
    tenant = identifier(args.tenant, "TENANT")
    task = identifier(args.task, "TASK")
    with opened_store(args) as store:
        with store.transaction(read_only=True) as tx:
            require_tenant(tx, tenant)
        return act(store, tenant, task)


def _tasks_links(args: argparse.Namespace) -> int:
    links = _in_tenant(args, task_links)
    if args.json:
        print_json([_json(link) for link in links])
    elif not links:
        print(f"(task {args.tenant}/{args.task} has no links: add one with `capgate tasks link`)")
    else:
        table(
            ["RESOURCE", "LINKED BY", "AT"],
            [[_name(link.resource), safe(link.linked_by), when(link.linked_at)] for link in links],
        )
    return EXIT_OK


def _tasks_link(args: argparse.Namespace) -> int:
    resource, by = resource_ref(args.resource), operator(args.by)
    link, made = _in_tenant(
        args, lambda store, tenant, task: link_resource(store, tenant, task, resource, by=by)
    )
    where = f"task {link.tenant}/{link.task_id}"
    if args.json:
        print_json({"link": _json(link), "linked_now": made})
    elif made:
        print(f"linked {_name(resource)} to {where} (by {safe(by)})")
    else:
        print(
            f"{_name(resource)} was linked to {where} already, by {safe(link.linked_by)} "
            f"at {when(link.linked_at)}: nothing changed"
        )
    return EXIT_OK


def _tasks_unlink(args: argparse.Namespace) -> int:
    resource, by = resource_ref(args.resource), operator(args.by)
    removed = _in_tenant(
        args, lambda store, tenant, task: unlink_resource(store, tenant, task, resource, by=by)
    )
    where = f"task {args.tenant}/{args.task}"
    if args.json:
        print_json({"unlinked": None if removed is None else _json(removed)})
    elif removed is None:
        print(f"{_name(resource)} was not linked to {where}: nothing changed")
    else:
        print(f"unlinked {_name(resource)} from {where} (by {safe(by)})")
    return EXIT_OK


def _name(resource: ResourceRef) -> str:
    return f"{resource.type}:{resource.id}"


def register(sub: Actions) -> None:
    """Add ``tasks`` to the ``capgate`` parser."""
    tasks = add_group(
        sub,
        "tasks",
        "link resources to a task, unlink them, list them",
        "The resources a task may work on, as the gateway records them: each link names "
        "who made it and when, and every link and unlink is a ledger row. A resource is "
        "TYPE:ID, e.g. invoice:inv-9.",
        STORE_EXITS,
    )
    listing = add_action(tasks, "links", "list the resources linked to a task", _tasks_links)
    listing.add_argument("tenant", metavar="TENANT")
    listing.add_argument("task", metavar="TASK")
    add_json(listing, "the links")
    for name, run, what in (
        ("link", _tasks_link, "link a resource to a task"),
        ("unlink", _tasks_unlink, "remove a resource's link to a task"),
    ):
        action = add_action(tasks, name, what, run)
        action.add_argument("tenant", metavar="TENANT")
        action.add_argument("task", metavar="TASK")
        action.add_argument("resource", metavar="TYPE:ID", help="e.g. invoice:inv-9")
        add_by(action)
        add_json(action, "the result")
