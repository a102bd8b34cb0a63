"""Task links: the resources a task may work on, as the gateway recorded them.

A link is one row per task and resource, written once: linking again keeps the
first (who linked it, and when), so two people linking the same invoice at once
both succeed and agree. Unlinking removes the row; the ledger keeps both acts.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists); values always travel as bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, StoreError
from capgate.gateway.model.facts import ResourceRef
from capgate.gateway.state.records import TaskLinkRecord
from capgate.gateway.state.sql.core import TxCore, _stored, _time, _validated

__all__ = ["MAX_LINKS", "LinksTx"]

#: The most resources one task may have linked: what a task input carries to OPA
#: stays bounded.
MAX_LINKS: Final = 256

_LINK_COLUMNS: Final = "tenant, task_id, resource_type, resource_id, linked_by, linked_at"
_KEY: Final = (
    "tenant = :tenant AND task_id = :task AND resource_type = :rtype AND resource_id = :rid"
)


def _link(row: Mapping[str, Any]) -> TaskLinkRecord:
    return _stored(
        TaskLinkRecord,
        {
            "tenant": row["tenant"],
            "task_id": row["task_id"],
            "resource": {"type": row["resource_type"], "id": row["resource_id"]},
            "linked_by": row["linked_by"],
            "linked_at": _time(row["linked_at"]),
        },
        "task link",
    )


class LinksTx(TxCore):
    """Task links: which resources a task may work on, linked by whom."""

    def link_resource(
        self, tenant: str, task_id: str, resource: ResourceRef, *, by: str
    ) -> tuple[TaskLinkRecord, bool]:
        record = _validated(
            TaskLinkRecord,
            {
                "tenant": tenant,
                "task_id": task_id,
                "resource": resource,
                "linked_by": by,
                "linked_at": self.now,
            },
            "task link",
        )
        self._tenant_row(tenant)
        key = self._key(record.tenant, record.task_id, record.resource)
        found = self._row(f"SELECT {_LINK_COLUMNS} FROM task_links WHERE {_KEY}", key)
        if found is not None:
            return _link(found), False
        (counted,) = self._rows(
            "SELECT COUNT(*) AS n FROM task_links WHERE tenant = :tenant AND task_id = :task",
            key,
        )
        if counted["n"] >= MAX_LINKS:
            raise InvalidInput(
                f"task {task_id!r} has {MAX_LINKS} links already, the most one task may have"
            )
        # Two transactions linking the same resource at once: the second keeps the first.
        inserted = self._run(
            "INSERT INTO task_links (tenant, task_id, resource_type, resource_id, linked_by, "
            "linked_at) VALUES (:tenant, :task, :rtype, :rid, :by, :now) "
            "ON CONFLICT (tenant, task_id, resource_type, resource_id) DO NOTHING",
            {**key, "by": record.linked_by, "now": self._at},
        )
        row = self._row(f"SELECT {_LINK_COLUMNS} FROM task_links WHERE {_KEY}", key)
        if row is None:  # pragma: no cover - inserted or present in this transaction
            raise StoreError("a task link vanished while it was recorded")
        return _link(row), inserted == 1

    def unlink_resource(
        self, tenant: str, task_id: str, resource: ResourceRef
    ) -> TaskLinkRecord | None:
        self._tenant_row(tenant)
        key = self._key(tenant, task_id, ResourceRef.model_validate(resource))
        found = self._row(f"SELECT {_LINK_COLUMNS} FROM task_links WHERE {_KEY}", key)
        if found is None:
            return None
        self._run(f"DELETE FROM task_links WHERE {_KEY}", key)
        return _link(found)

    def task_links(self, tenant: str, task_id: str) -> list[TaskLinkRecord]:
        rows = self._rows(
            f"SELECT {_LINK_COLUMNS} FROM task_links WHERE tenant = :tenant AND task_id = :task",
            {"tenant": tenant, "task": task_id},
        )
        # Ordered here, not by the backends' collations: the same answer on both.
        keyed = sorted(rows, key=lambda r: (r["resource_type"], r["resource_id"]))
        return [_link(row) for row in keyed]

    @staticmethod
    def _key(tenant: str, task_id: str, resource: ResourceRef) -> dict[str, str]:
        return {"tenant": tenant, "task": task_id, "rtype": resource.type, "rid": resource.id}
