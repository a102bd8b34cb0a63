"""Settling an operation: its outcome written once, its budget settled once.

Shared by the runs of operations and by recovery, so that whichever step learns what
happened (the run itself, a late runner, a lookup), the row and the budget follow
one rule: success spends the reservation, refused and retryable release it, and
unknown keeps it held until a lookup says what happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from capgate.gateway.model.contracts import ABOUT_SUBJECT, ToolContract
from capgate.gateway.model.facts import EvidenceSubject
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.state.records import OperationRecord, OperationStatus
from capgate.gateway.state.store import Tx

__all__ = ["call_about", "conclude", "evidence_subject", "record_produced", "stopped"]


def conclude(tx: Tx, current: OperationRecord, outcome: Outcome) -> OperationRecord:
    """Write ``outcome`` over the operation (``current``, locked) and settle its budget.

    One operation, one charge, settled once: success counts its reservation as spent,
    refused and retryable release it (nothing happened), and unknown keeps holding it
    until a lookup (or a later attempt) says what happened, so an uncertain payment
    is never handed back to the budget as if it had not been made.
    """
    unknown = outcome.status is OutcomeStatus.UNKNOWN
    if current.reserved and not unknown:
        tx.settle_budget(
            current.tenant,
            current.task_id,
            current.cost,
            spent=outcome.status is OutcomeStatus.SUCCESS,
        )
    return tx.update_operation(
        current.tenant,
        current.operation_id,
        status=OperationStatus.DONE,
        outcome=outcome.model_dump(mode="json"),
        attempts=current.attempts,
        lease_until=None,
        reserved=current.reserved and unknown,
    )


def record_produced(
    tx: Tx,
    contract: ToolContract,
    tenant: str,
    task_id: str | None,
    operation_id: str,
    outcome: Outcome,
    about: Mapping[str, Any] | None,
) -> list[str]:
    """Record, for the task, the evidence a successful operation produces; its names.

    ``about`` is what the call was about: its ``subject`` and ``values`` as the policy
    saw them (:func:`call_about`), or None when they are not known (an operation
    settled by a lookup without its proposal), which records the evidence about
    nothing: it then meets only requirements about anything, never one about a
    subject, so not knowing never grants more. Each piece's expiry is counted from
    the store's clock.
    """
    if outcome.status is not OutcomeStatus.SUCCESS or task_id is None:
        return []
    for produced in contract.produces:
        expires_at = None
        if produced.ttl_seconds is not None:
            expires_at = tx.now + timedelta(seconds=produced.ttl_seconds)
        tx.record_evidence(
            tenant,
            task_id,
            produced.name,
            source=f"operation:{operation_id}",
            subject=evidence_subject(contract, contract.produced_about(produced), about),
            expires_at=expires_at,
        )
    return contract.produced_names


def call_about(subject: Mapping[str, str] | None, values: Mapping[str, Any]) -> dict[str, Any]:
    """What a call is about, for :func:`record_produced`: its subject and values."""
    return {"subject": subject, "values": values}


def evidence_subject(
    contract: ToolContract, about: str | None, call: Mapping[str, Any] | None
) -> EvidenceSubject | None:
    """The subject of evidence about ``about`` (``subject``, a value name or None) of
    a call of ``contract`` (:func:`call_about`); None when there is none to name (about
    nothing, the call unknown, or an absent optional value)."""
    if about is None or call is None:
        return None
    if about == ABOUT_SUBJECT:
        subject = call.get("subject")
        if not isinstance(subject, Mapping):
            return None
        return EvidenceSubject(type=subject["type"], id=subject["id"])
    value = call.get("values", {}).get(about)
    kind = contract.evidence_kind(about)
    if not isinstance(value, str) or not value or kind is None:
        return None
    return EvidenceSubject(type=kind, id=value)


def stopped(operation: OperationRecord, contract: ToolContract) -> Outcome:
    """The outcome of an operation whose runner stopped mid-run: unknown."""
    return Outcome(
        tool=operation.tool,
        version=contract.version,
        operation_id=operation.operation_id,
        status=OutcomeStatus.UNKNOWN,
        error="the gateway stopped while the operation ran",
        recovery=contract.recovery,
    )
