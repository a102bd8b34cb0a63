"""Task links: linking a resource to a task is an act the gateway records.

The seed's delivery task gains read access to one repository after its work order
links it: the link is a fact with an author and a time, not a list each request
repeats. Here it is written with its ledger row in one transaction, so the store
never holds a link the ledger does not tell, nor the other way round. Linking what
is linked already, or unlinking what is not, changes nothing and is recorded as
such (``already_linked``, ``not_linked``).

Operators link from the command line (``capgate tasks link``) and services through
:class:`~capgate.gateway.service.gateway.Gateway`; both are trusted callers, so no
policy is asked for them. An agent links over MCP (``capgate.tasks.link``) through
:func:`agent_link`, which asks the link policy first (``capgate/link``: may its role
link this type of resource, and is the task another than its own?) and records a
refusal as a ``task_link`` row of outcome ``refused``, with its reason codes. The
agent, its role, tenant and own task come from its authenticated binding (an
:class:`~capgate.gateway.service.requests.AgentRequest`), never from the arguments;
the link is made in the agent's own tenant, and nothing is written before the
policy allows.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from capgate.gateway.errors import CapabilityViolation, InvalidInput, PolicyUnavailable, quote
from capgate.gateway.model.decisions import LinkDecision, policy_revision
from capgate.gateway.model.facts import LinkInput, ResourceRef, checked_identifier
from capgate.gateway.service.ledger import append, who
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import LedgerEntry, TaskLinkRecord
from capgate.gateway.state.store import Store

__all__ = [
    "AgentLink",
    "LinkPolicy",
    "agent_link",
    "link_outcome",
    "link_resource",
    "resource_ref",
    "task_links",
    "unlink_resource",
]

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
    link, made = _change(store, "link", tenant, task_id, ref, by)
    assert link is not None  # a link is made, or the one there stands
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
    removed, _ = _change(store, "unlink", tenant, task_id, ref, by)
    return removed


@runtime_checkable
class LinkPolicy(Protocol):
    """A policy client that answers the link question (``PolicyClient`` does)."""

    def link(self, facts: LinkInput) -> LinkDecision: ...


AgentLink = tuple[TaskLinkRecord | None, bool]


def agent_link(
    store: Store,
    policy: object,
    request: AgentRequest,
    action: Literal["link", "unlink"],
    task_id: str,
    resource: ResourceRef | dict[str, Any],
) -> AgentLink:
    """An agent links ``resource`` to (or unlinks it from) a task of its tenant, if
    the link policy allows: the link (for ``unlink``, the one removed, or None) and
    whether this call changed anything.

    InvalidInput naming the field before OPA is asked; PolicyUnavailable when the
    policy cannot answer (or is not a :class:`LinkPolicy`: nothing is linked without
    an answer); CapabilityViolation with the policy's reasons when it refuses,
    recorded as a ``refused`` row; UnknownTenant for a tenant the store lacks.
    """
    tenant, task_id, ref = _checked(request.tenant, task_id, resource)
    if not isinstance(policy, LinkPolicy):
        raise PolicyUnavailable("the policy client cannot answer the link question")
    facts = LinkInput.model_validate(
        {
            "principal": request.principal,
            "authenticated_by": request.authenticated_by or "library",
            "task": {"id": request.task_id, "type": request.task.type},
            "link": {"action": action, "task_id": task_id, "resource": ref},
        }
    )
    decision = policy.link(facts)
    by = who(request.principal)
    asked = {
        "decision_id": decision.decision_id,
        "policy_revision": policy_revision(decision.bundle_revisions),
        "authenticated_by": facts.authenticated_by,
    }
    if not decision.allow or decision.reasons:
        append(store, _row(tenant, task_id, ref, by, "refused", decision.reason_codes, **asked))
        if decision.allow:  # an allow with reasons contradicts itself: refuse it
            raise PolicyUnavailable("OPA returned an inconsistent link allow")
        raise CapabilityViolation(
            f"capgate.tasks.{action}", decision.reasons, decision_id=decision.decision_id
        )
    link, made = _change(store, action, tenant, task_id, ref, by, **asked)
    log.info("task %s by agent tenant=%s task=%s resource=%s:%s by=%s outcome=%s", action,
             tenant, task_id, ref.type, ref.id, by, link_outcome(action, made))  # fmt: skip
    return link, made


def link_outcome(action: Literal["link", "unlink"], changed: bool) -> str:
    """What a link or unlink came to, as the ledger and the fronts' answers say it."""
    if action == "link":
        return "linked" if changed else "already_linked"
    return "unlinked" if changed else "not_linked"


def _change(
    store: Store,
    action: Literal["link", "unlink"],
    tenant: str,
    task_id: str,
    ref: ResourceRef,
    by: str,
    **asked: Any,
) -> AgentLink:
    """The one write of a link or an unlink, operator's, service's or agent's, with
    its ledger row in the same transaction: the link (made, standing, or removed)
    and whether anything changed. ``asked``: the link decision of an agent's."""
    link: TaskLinkRecord | None
    with store.transaction() as tx:
        if action == "link":
            link, changed = tx.link_resource(tenant, task_id, ref, by=by)
        else:
            link = tx.unlink_resource(tenant, task_id, ref)
            changed = link is not None
        tx.append(_row(tenant, task_id, ref, by, link_outcome(action, changed), **asked))
    return link, changed


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


def _row(
    tenant: str,
    task_id: str,
    ref: ResourceRef,
    by: str,
    outcome: str,
    reason_codes: list[str] | None = None,
    *,
    decision_id: str | None = None,
    policy_revision: str | None = None,
    authenticated_by: str | None = None,
) -> LedgerEntry:
    """A ``task_link`` row; an agent's carries the link decision and how the agent
    was authenticated (an operator's or a service's asks no policy)."""
    asked = {"authenticated_by": authenticated_by} if authenticated_by else {}
    return LedgerEntry(
        kind="task_link",
        tenant=tenant,
        principal=by,
        outcome=outcome,
        reason_codes=reason_codes or [],
        decision_id=decision_id,
        policy_revision=policy_revision,
        detail={"task_id": task_id, "resource": {"type": ref.type, "id": ref.id}, **asked},
    )
