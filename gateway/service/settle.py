"""Settling an operation: its outcome written once, its budget settled once.

Shared by the runs of operations and by recovery, so that whichever step learns what
happened (the run itself, a late runner, a lookup), the row and the budget follow
one rule: success spends the reservation, refused and retryable release it, and
unknown keeps it held until a lookup says what happened.
"""

from __future__ import annotations

from capgate.gateway.model.contracts import ToolContract
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.state.records import OperationRecord, OperationStatus
from capgate.gateway.state.store import Tx

__all__ = ["conclude", "record_produced", "stopped"]


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
) -> list[str]:
    """Record, for the task, the evidence a successful operation produces; its names."""
    if outcome.status is not OutcomeStatus.SUCCESS or task_id is None:
        return []
    for name in contract.produces:
        tx.record_evidence(tenant, task_id, name, source=f"operation:{operation_id}")
    return list(contract.produces)


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
