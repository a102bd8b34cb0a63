"""Tenants and their budgets: the rows a call's cost is reserved against.

A budget is the fact racing calls all want to change, so its check and its update
must be one step: reserving, settling and setting a limit read the rows they change
locked, the tenant's row always before the task's, so two transactions never wait
for each other in opposite orders. Settling checks what is reserved before it frees
anything, so settling twice cannot give budget back.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capgate.gateway.errors import BudgetNotReserved
from capgate.gateway.state.records import BudgetState, TenantRecord
from capgate.gateway.state.sql.core import (
    _TENANT_COLUMNS,
    TxCore,
    _amount,
    _identifier,
    _stored,
    _validated,
)

__all__ = ["TenantsTx"]


def _limit(value: object, what: str) -> int | None:
    return None if value is None else _amount(value, what)


def _fits(limit: int | None, reserved: int, spent: int, cost: int) -> bool:
    """Whether ``cost`` more fits under ``limit`` (written to never overflow)."""
    return limit is None or limit - reserved - spent >= cost


def _tenant(row: Mapping[str, Any]) -> TenantRecord:
    return _stored(
        TenantRecord,
        {k: row[k] for k in ("tenant", "budget_class", "budget_limit")},
        "tenant",
    )


class TenantsTx(TxCore):
    """Tenants: who may act, and what their calls may spend."""

    def put_tenant(
        self, tenant: str, *, budget_class: str, budget_limit: int | None
    ) -> TenantRecord:
        """Create or update a tenant (its reservations and spending are kept)."""
        record = _validated(
            TenantRecord,
            {"tenant": tenant, "budget_class": budget_class, "budget_limit": budget_limit},
            "tenant",
        )
        self._run(
            "INSERT INTO tenants (tenant, budget_class, budget_limit, reserved, spent, "
            "created_at, updated_at) VALUES (:tenant, :budget_class, :budget_limit, 0, 0, "
            ":now, :now) ON CONFLICT (tenant) DO UPDATE SET budget_class = "
            "excluded.budget_class, budget_limit = excluded.budget_limit, "
            "updated_at = excluded.updated_at",
            {**record.model_dump(), "now": self._at},
        )
        return record

    def get_tenant(self, tenant: str) -> TenantRecord | None:
        row = self._row(
            f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE tenant = :tenant", {"tenant": tenant}
        )
        return None if row is None else _tenant(row)

    def tenants(self) -> list[TenantRecord]:
        return [
            _tenant(row)
            for row in self._rows(f"SELECT {_TENANT_COLUMNS} FROM tenants ORDER BY tenant")
        ]

    def set_budget_limit(self, tenant: str, limit: int | None) -> TenantRecord:
        """Change the tenant's limit; ``UnknownTenant`` if there is no such tenant."""
        value = _limit(limit, "budget limit")
        row = self._tenant_row(tenant, lock=True)
        self._run(
            "UPDATE tenants SET budget_limit = :limit, updated_at = :now WHERE tenant = :tenant",
            {"tenant": tenant, "limit": value, "now": self._at},
        )
        return _tenant({**row, "budget_limit": value})

    def set_task_budget(self, tenant: str, task_id: str, limit: int | None) -> None:
        """Give one task its own limit (``None`` removes it); spending is kept."""
        task = _identifier(task_id, "task_id")
        value = _limit(limit, "task budget limit")
        self._tenant_row(tenant, lock=True)  # tenant row first: the budgets' lock order
        self._run(
            "INSERT INTO task_budgets (tenant, task_id, budget_limit, reserved, spent, "
            "updated_at) VALUES (:tenant, :task, :limit, 0, 0, :now) ON CONFLICT "
            "(tenant, task_id) DO UPDATE SET budget_limit = excluded.budget_limit, "
            "updated_at = excluded.updated_at",
            {"tenant": tenant, "task": task, "limit": value, "now": self._at},
        )

    def _task_row(self, tenant: str, task_id: str, *, lock: bool) -> dict[str, Any] | None:
        return self._row(
            "SELECT budget_limit, reserved, spent FROM task_budgets "
            f"WHERE tenant = :tenant AND task_id = :task{self._locked(lock)}",
            {"tenant": tenant, "task": task_id},
        )

    def budget(self, tenant: str, task_id: str | None = None) -> BudgetState:
        """The tenant's budget, or the task's when the task has its own limit."""
        row = self._tenant_row(tenant)
        if task_id is not None:
            task = self._task_row(tenant, task_id, lock=False)
            if task is not None and task["budget_limit"] is not None:
                return _stored(
                    BudgetState,
                    {
                        "tenant": tenant,
                        "task_id": task_id,
                        "limit": task["budget_limit"],
                        "reserved": task["reserved"],
                        "spent": task["spent"],
                    },
                    "task budget",
                )
        return _stored(
            BudgetState,
            {
                "tenant": tenant,
                "limit": row["budget_limit"],
                "reserved": row["reserved"],
                "spent": row["spent"],
            },
            "budget",
        )

    def reserve_budget(self, tenant: str, task_id: str | None, cost: int) -> bool:
        """Reserve ``cost`` against the tenant's limit and, if the task has one, the
        task's; False (nothing reserved) when either would be exceeded.

        A cost of 0 always fits. The task's reservations and spending are counted
        even while it has no limit of its own, so a limit set later sees them.
        """
        amount = _amount(cost, "cost")
        task = None if task_id is None else _identifier(task_id, "task_id")
        row = self._tenant_row(tenant, lock=True)
        if amount == 0:
            return True
        if not _fits(row["budget_limit"], row["reserved"], row["spent"], amount):
            return False
        params = {"tenant": tenant, "task": task, "cost": amount, "now": self._at}
        if task is not None:
            task_row = self._task_row(tenant, task, lock=True)
            if task_row is not None and not _fits(
                task_row["budget_limit"], task_row["reserved"], task_row["spent"], amount
            ):
                return False
            self._run(
                "INSERT INTO task_budgets (tenant, task_id, budget_limit, reserved, spent, "
                "updated_at) VALUES (:tenant, :task, NULL, :cost, 0, :now) ON CONFLICT "
                "(tenant, task_id) DO UPDATE SET reserved = task_budgets.reserved + "
                "excluded.reserved, updated_at = excluded.updated_at",
                params,
            )
        self._run("UPDATE tenants SET reserved = reserved + :cost WHERE tenant = :tenant", params)
        return True

    def settle_budget(self, tenant: str, task_id: str | None, cost: int, *, spent: bool) -> None:
        """End a reservation of ``cost``: count it as spent, or release it.

        ``BudgetNotReserved`` (and nothing changed) when less than ``cost`` is
        reserved for the tenant or the task: settling twice must not free budget.
        """
        amount = _amount(cost, "cost")
        row = self._tenant_row(tenant, lock=True)
        if amount == 0:
            return  # nothing was reserved, so nothing is spent or released
        if row["reserved"] < amount:
            raise BudgetNotReserved(tenant, None, row["reserved"], amount)
        params = {
            "tenant": tenant,
            "task": task_id,
            "cost": amount,
            "spent": amount if spent else 0,
            "now": self._at,
        }
        if task_id is not None:
            task_row = self._task_row(tenant, task_id, lock=True)
            reserved = 0 if task_row is None else task_row["reserved"]
            if reserved < amount:
                raise BudgetNotReserved(tenant, task_id, reserved, amount)
            self._run(
                "UPDATE task_budgets SET reserved = reserved - :cost, spent = spent + :spent, "
                "updated_at = :now WHERE tenant = :tenant AND task_id = :task",
                params,
            )
        self._run(
            "UPDATE tenants SET reserved = reserved - :cost, spent = spent + :spent "
            "WHERE tenant = :tenant",
            params,
        )
