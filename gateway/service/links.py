"""Task links: linking a resource to a task is an act the gateway records.

The seed's delivery task gains read access to one repository after its work order
links it: the link is a fact with an author and a time, not a list each request
repeats. Here it is written with its ledger row in one transaction, so the store
never holds a link the ledger does not tell, nor the other way round. Linking what
is linked already, or unlinking what is not, changes nothing and is recorded as
such (``already_linked``, ``not_linked``).

Operators link from the command line (``capgate tasks link``) and services through
:class:`~capgate.gateway.service.gateway.Gateway`; both are trusted callers, so no
policy is asked here.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from capgate.gateway.errors import InvalidInput, quote
from capgate.gateway.model.facts import ResourceRef, checked_identifier
from capgate.gateway.state.records import LedgerEntry, TaskLinkRecord
from capgate.gateway.state.store import Store

__all__ = ["link_resource", "resource_ref", "task_links", "unlink_resource"]

log = logging.getLogger("capgate.service")


def link_resource(
    store: Store, tenant: str, task_id: str, resource: ResourceRef | dict[str, Any], *, by: str
) -> tuple[TaskLinkRecord, bool]:
    """Link ``resource`` to the tenant's task, recorded with a ledger row naming
    ``by``: the link, and whether this call made it (False: it was linked already,
    and the first link stands). InvalidInput naming the
    field for a malformed tenant, task or resource; UnknownTenant for a tenant the
    store does not hold."""
    tenant, task_id, ref = _checked(tenant, task_id, resource)
    with store.transaction() as tx:
        link, made = tx.link_resource(tenant, task_id, ref, by=by)
        tx.append(_row(tenant, task_id, ref, by, "linked" if made else "already_linked"))
    log.info("task link tenant=%s task=%s resource=%s:%s by=%s", tenant, task_id,
             ref.type, ref.id, by)  # fmt: skip
    return link, made


def unlink_resource(
    store: Store, tenant: str, task_id: str, resource: ResourceRef | dict[str, Any], *, by: str
) -> TaskLinkRecord | None:
    """Remove the link, recorded with a ledger row naming ``by``; the link removed,
    or None when there was none (recorded as ``not_linked``). UnknownTenant for a
    tenant the store does not hold."""
    tenant, task_id, ref = _checked(tenant, task_id, resource)
    with store.transaction() as tx:
        removed = tx.unlink_resource(tenant, task_id, ref)
        tx.append(_row(tenant, task_id, ref, by, "unlinked" if removed else "not_linked"))
    return removed


def task_links(store: Store, tenant: str, task_id: str) -> list[TaskLinkRecord]:
    """The task's links, by resource type and id."""
    tenant = checked_identifier(tenant, "tenant")
    task_id = checked_identifier(task_id, "task")
    with store.transaction(read_only=True) as tx:
        return tx.task_links(tenant, task_id)


def resource_ref(text: str) -> ResourceRef:
    """``TYPE:ID`` (``invoice:inv-9``) as a resource; InvalidInput naming the rule."""
    kind, sep, ident = text.partition(":") if isinstance(text, str) else ("", "", "")
    if not sep:
        raise InvalidInput(f"resource {quote(str(text), 80)} is not TYPE:ID (e.g. invoice:inv-9)")
    return _resource({"type": kind, "id": ident})


def _checked(
    tenant: str, task_id: str, resource: ResourceRef | dict[str, Any]
) -> tuple[str, str, ResourceRef]:
    return (
        checked_identifier(tenant, "tenant"),
        checked_identifier(task_id, "task"),
        _resource(resource),
    )


def _resource(resource: object) -> ResourceRef:
    if isinstance(resource, ResourceRef):
        return resource
    try:
        return ResourceRef.model_validate(resource)
    except ValidationError as bad:
        fields = sorted({".".join(str(p) for p in e["loc"]) or "resource" for e in bad.errors()})
        raise InvalidInput(
            f"resource: {', '.join(fields)} must be an identifier (a resource is "
            "{type, id}, e.g. invoice:inv-9)"
        ) from None


def _row(tenant: str, task_id: str, ref: ResourceRef, by: str, outcome: str) -> LedgerEntry:
    return LedgerEntry(
        kind="task_link",
        tenant=tenant,
        principal=by,
        outcome=outcome,
        detail={"task_id": task_id, "resource": {"type": ref.type, "id": ref.id}},
    )
