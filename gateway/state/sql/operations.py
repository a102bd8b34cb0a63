"""Operations: the intent written before a tool runs, and what came of it.

An operation id is the idempotency key a tool receives, so it must be taken exactly
once however many calls race for it, in one process or several: the insert is
``ON CONFLICT DO NOTHING`` on ``(tenant, operation_id)`` and the losers see that no
row was added. What this transaction holds (read for update, inserted, updated) it
keeps in the core's held-rows cache, so an update starts from that record instead
of reading its row again. An outcome's status is repeated in a column of its own, so
the queries for ``unknown`` outcomes (what a reconciler looks up, a proposal's
unsettled twins) read that column, not every outcome's JSON.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, UnknownOperation
from capgate.gateway.state.records import OperationRecord, OperationStatus
from capgate.gateway.state.sql.core import TxCore, _dump, _load, _stored, _time, _validated
from capgate.gateway.state.times import to_text

__all__ = ["OperationsTx"]

_OPERATION_COLUMNS: Final = (
    "tenant, operation_id, tool, params_digest, task_id, status, outcome, cost, attempts, "
    "lease_until, created_at, updated_at, reserved"
)


def _operation(row: Mapping[str, Any]) -> OperationRecord:
    outcome = row["outcome"]
    return _stored(
        OperationRecord,
        {
            **row,
            "outcome": None if outcome is None else _load(outcome, "operation outcome"),
            "lease_until": _time(row["lease_until"]),
            "created_at": _time(row["created_at"]),
            "updated_at": _time(row["updated_at"]),
            "reserved": bool(row["reserved"]),
        },
        "operation",
    )


def _outcome_status(outcome: Mapping[str, Any] | None) -> str | None:
    """The status of a stored outcome, kept in its own column for the queries below."""
    if outcome is None:
        return None
    status = outcome.get("status")
    return status if isinstance(status, str) else None


class OperationsTx(TxCore):
    """Operations: each side-effecting call's intent, attempts and outcome."""

    def insert_operation(
        self,
        tenant: str,
        operation_id: str,
        *,
        tool: str,
        params_digest: str,
        cost: int,
        task_id: str | None,
        lease_until: datetime,
        reserved: bool = True,
    ) -> OperationRecord | None:
        """Insert a RUNNING operation (attempts 1); None if the id exists already.

        However many transactions race with one ``(tenant, operation_id)``, in one
        process or several, exactly one gets a record.
        """
        record = _validated(
            OperationRecord,
            {
                "tenant": tenant,
                "operation_id": operation_id,
                "tool": tool,
                "params_digest": params_digest,
                "task_id": task_id,
                "status": OperationStatus.RUNNING,
                "outcome": None,
                "cost": cost,
                "attempts": 1,
                "lease_until": lease_until,
                "created_at": self.now,
                "updated_at": self.now,
                "reserved": reserved,
            },
            "operation",
        )
        if record.lease_until is None:
            raise InvalidInput("operation: lease_until is required")
        self._tenant_row(tenant)
        inserted = self._run(
            f"INSERT INTO operations ({_OPERATION_COLUMNS}) VALUES (:tenant, :operation_id, "
            ":tool, :params_digest, :task_id, :status, NULL, :cost, 1, :lease_until, :now, "
            ":now, :reserved) ON CONFLICT (tenant, operation_id) DO NOTHING",
            {
                "tenant": tenant,
                "operation_id": operation_id,
                "tool": record.tool,
                "params_digest": record.params_digest,
                "task_id": record.task_id,
                "status": record.status.value,
                "cost": record.cost,
                "lease_until": to_text(record.lease_until),
                "now": self._at,
                "reserved": int(record.reserved),
            },
        )
        if inserted != 1:
            return None
        self._held[(tenant, operation_id)] = record
        return record

    def get_operation(
        self, tenant: str, operation_id: str, *, for_update: bool = False
    ) -> OperationRecord | None:
        """``for_update`` locks the row until the transaction ends (PostgreSQL; SQLite's
        writing transactions hold the whole database already)."""
        row = self._row(
            f"SELECT {_OPERATION_COLUMNS} FROM operations WHERE tenant = :tenant AND "
            f"operation_id = :operation_id{self._locked(for_update)}",
            {"tenant": tenant, "operation_id": operation_id},
        )
        if row is None:
            return None
        record = _operation(row)
        if for_update:
            self._held[(tenant, operation_id)] = record
        return record

    def update_operation(
        self,
        tenant: str,
        operation_id: str,
        *,
        status: OperationStatus,
        outcome: dict[str, Any] | None,
        attempts: int,
        lease_until: datetime | None,
        reserved: bool | None = None,
    ) -> OperationRecord:
        """Record the operation's new state; ``UnknownOperation`` if it does not exist.

        ``reserved`` None keeps the reservation flag as it is."""
        current = self._held.get((tenant, operation_id)) or self.get_operation(
            tenant, operation_id, for_update=True
        )
        if current is None:
            raise UnknownOperation(tenant, operation_id)
        record = _validated(
            OperationRecord,
            {
                **current.model_dump(),
                "status": status,
                "outcome": outcome,
                "attempts": attempts,
                "lease_until": lease_until,
                "updated_at": self.now,
                "reserved": current.reserved if reserved is None else reserved,
            },
            "operation",
        )
        self._run(
            "UPDATE operations SET status = :status, outcome = :outcome, "
            "outcome_status = :outcome_status, attempts = :attempts, "
            "lease_until = :lease_until, updated_at = :now, reserved = :reserved "
            "WHERE tenant = :tenant AND operation_id = :operation_id",
            {
                "tenant": tenant,
                "operation_id": operation_id,
                "status": record.status.value,
                "outcome": None if record.outcome is None else _dump(record.outcome),
                "outcome_status": _outcome_status(record.outcome),
                "attempts": record.attempts,
                "lease_until": None if record.lease_until is None else to_text(record.lease_until),
                "now": self._at,
                "reserved": int(record.reserved),
            },
        )
        self._held[(tenant, operation_id)] = record
        return record

    def stale_operations(self) -> list[OperationRecord]:
        """RUNNING operations whose lease ended before ``now``, oldest lease first.

        Rows are not locked: a reconciler takes each with
        ``get_operation(..., for_update=True)`` and checks it is still stale.
        """
        rows = self._rows(
            f"SELECT {_OPERATION_COLUMNS} FROM operations WHERE status = 'running' AND "
            "lease_until IS NOT NULL AND lease_until < :now "
            "ORDER BY lease_until, tenant, operation_id",
            {"now": self._at},
        )
        return [_operation(row) for row in rows]

    def unsettled_operations(self) -> list[OperationRecord]:
        """Finished operations whose outcome is ``unknown``, least recently touched
        first: what a reconciler looks up. Rows are not locked (as above)."""
        rows = self._rows(
            f"SELECT {_OPERATION_COLUMNS} FROM operations WHERE outcome_status = 'unknown' "
            "AND status = 'done' ORDER BY updated_at, tenant, operation_id",
        )
        return [_operation(row) for row in rows]

    def unsettled_twins(self, tenant: str, tool: str, params_digest: str) -> list[str]:
        """The ids of the tenant's operations of ``tool`` with exactly these parameters
        that are running or ended ``unknown``: a new operation with the same content
        may do what one of them already did."""
        rows = self._rows(
            "SELECT operation_id FROM operations WHERE tenant = :tenant AND tool = :tool "
            "AND params_digest = :digest AND (status = 'running' OR outcome_status = 'unknown') "
            "ORDER BY created_at, operation_id",
            {"tenant": tenant, "tool": tool, "digest": params_digest},
        )
        return [row["operation_id"] for row in rows]
