"""Which ledger rows are notices, and what a notice says.

The ledger is the outbox: every step of a proposal's life writes its row in the
transaction that makes the step (proposed, reviewed, dispatched, blocked, settled),
so a notice is derived from a committed row, never from a step that might still roll
back, and none is lost when a process dies between the step and the notice. The rows
and the events they become are written here once (:data:`_EVENTS`):

=============================  ================================================
ledger row (kind, outcome)     event
=============================  ================================================
``proposal``, ``pending``      ``proposal.created``
``review``, ``approved``       ``proposal.approved``
``review``, ``rejected``       ``proposal.rejected`` (a refused review: none)
``dispatch``, ``dispatched``   ``proposal.dispatched`` (the approval consumed, the
                               execution action about to run)
``outcome``, any status        ``proposal.outcome`` (what the run came to)
``lookup``, not ``unknown``    ``proposal.outcome`` (a lookup settled it)
``dispatch``, ``blocked``      ``proposal.blocked`` (with the reason codes)
``worker``, ``given_up``       ``proposal.given_up`` (with the reason codes)
=============================  ================================================

Only rows naming a proposal count. An event carries ids, the tool, the parameters'
digest, statuses and reason codes, and a link to the review inbox: never the
parameters (content, recipients), a result or a receipt, since a webhook receiver is
outside the gateway's trust. Its id is derived from the row's hash, so a notice
delivered again (at least once) has the same id and the same body bytes.
"""

from __future__ import annotations

from typing import Any, Final

from capgate.gateway.digest import canonical_json
from capgate.gateway.service.notices.settings import EventType, NoticeSettings
from capgate.gateway.state.records import LedgerRow, ProposalRecord
from capgate.gateway.state.times import to_text

__all__ = ["NOTICE_VERSION", "event_id", "event_type", "notice_body"]

#: The payload's version, in its ``version`` field: a receiver can refuse what it
#: does not know.
NOTICE_VERSION: Final = 1

_EVENTS: Final[dict[tuple[str, str], EventType]] = {
    ("proposal", "pending"): "proposal.created",
    ("review", "approved"): "proposal.approved",
    ("review", "rejected"): "proposal.rejected",
    ("dispatch", "dispatched"): "proposal.dispatched",
    ("dispatch", "blocked"): "proposal.blocked",
    ("worker", "given_up"): "proposal.given_up",
}
#: Rows whose outcome is an operation's status.
_OUTCOME_KINDS: Final = frozenset({"outcome", "lookup"})


def event_type(row: LedgerRow) -> EventType | None:
    """The event a ledger row is, or None (not about a proposal, or not a step)."""
    if row.proposal_id is None or row.outcome is None:
        return None
    if row.kind in _OUTCOME_KINDS:
        # A lookup that found nothing new leaves the outcome unknown: no step.
        if row.kind == "lookup" and row.outcome == "unknown":
            return None
        return "proposal.outcome"
    return _EVENTS.get((row.kind, row.outcome))


def event_id(row: LedgerRow) -> str:
    """The event's id: ``evt_`` and 32 hex digits of the row's hash, unique (the chain
    makes every hash unique) and the same however often it is delivered."""
    return "evt_" + row.hash.removeprefix("sha256:")[:32]


def notice_body(
    row: LedgerRow, kind: EventType, proposal: ProposalRecord, settings: NoticeSettings
) -> bytes:
    """The event's JSON, in canonical form (the bytes signed and sent)."""
    event: dict[str, Any] = {
        "version": NOTICE_VERSION,
        "id": event_id(row),
        "type": kind,
        "tenant": proposal.tenant,
        "occurred_at": to_text(row.at),
        "ledger_seq": row.seq,
        "proposal_id": proposal.id,
        "tool": proposal.tool,
        "contract_version": proposal.contract_version,
        "params_digest": proposal.params_digest,
        "operation_id": proposal.operation_id,
        "by": row.principal,
        "decision_id": row.decision_id,
        "reason_codes": list(row.reason_codes),
        "inbox_url": settings.link(proposal.id),
    }
    if kind == "proposal.outcome":
        event["outcome"] = row.outcome
    return canonical_json(event)
