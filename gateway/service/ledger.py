"""The ledger rows the life-cycle steps write, shaped in one place.

Every step of the gateway appends rows of the same few shapes (a decision, a
proposal, an intent, an outcome, a dispatch...). Who is named and how, and which
fields an authorised call's rows carry, is decided here once, so the rows of one
operation always read alike whichever step wrote them. Nothing here decides.
"""

from __future__ import annotations

import hashlib
from typing import Any

from capgate.gateway.enforce.grant import Authorised
from capgate.gateway.model.facts import Principal, Reviewer
from capgate.gateway.state.records import LedgerEntry
from capgate.gateway.state.store import Store

__all__ = ["append", "entry", "reviewer_detail", "reviewer_name", "text_digest", "who"]


def who(principal: Principal) -> str:
    """How a principal is named in a row: ``agent/role`` (the tenant has its own field)."""
    return f"{principal.agent}/{principal.role}"


def reviewer_name(reviewer: Reviewer) -> str:
    """How a reviewer is named in a row: ``id/role``, the authenticated id."""
    return f"{reviewer.id}/{reviewer.role}"


def reviewer_detail(reviewer: Reviewer) -> dict[str, Any]:
    """What a review row records of who gave it: the authenticated id, its kind and
    how it was authenticated (the display name stays in the review record)."""
    detail: dict[str, Any] = {
        "reviewer": reviewer.id,
        "reviewer_kind": reviewer.kind,
        "authenticated_by": reviewer.authenticated_by,
    }
    if reviewer.acts_for is not None:
        detail["acts_for"] = reviewer.acts_for
    return detail


def text_digest(text: object) -> str:
    """``sha256:<hex>`` of a caller's string, to record it without repeating it."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else repr(text).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def entry(kind: str, authorised: Authorised, **fields: Any) -> LedgerEntry:
    """A row about an authorised call: its principal, tool, version, operation and the
    decision that allowed it, with ``fields`` (outcome, detail, ...)."""
    principal = authorised.request.principal
    return LedgerEntry(
        kind=kind,
        tenant=principal.tenant,
        principal=who(principal),
        tool=authorised.contract.name,
        contract_version=authorised.contract.version,
        operation_id=authorised.operation_id,
        decision_id=authorised.decision_id,
        policy_revision=authorised.revision,
        **fields,
    )


def append(store: Store, row: LedgerEntry) -> None:
    """One row in a transaction of its own (for steps that write nothing else)."""
    with store.transaction() as tx:
        tx.append(row)
