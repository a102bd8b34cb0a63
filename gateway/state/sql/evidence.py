"""The evidence a task has recorded, which other contracts' ``requires`` read.

Evidence is written once and never changed: a second recording of the same name
keeps the first (``ON CONFLICT DO NOTHING``), so two calls that produce it at once
both succeed and agree on its source and time.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import StoreError
from capgate.gateway.state.records import EvidenceRecord
from capgate.gateway.state.sql.core import TxCore, _stored, _time, _validated

__all__ = ["EvidenceTx"]

_EVIDENCE_COLUMNS: Final = "tenant, task_id, name, source, recorded_at"


def _evidence(row: Mapping[str, Any]) -> EvidenceRecord:
    return _stored(EvidenceRecord, {**row, "recorded_at": _time(row["recorded_at"])}, "evidence")


class EvidenceTx(TxCore):
    """Evidence: what a task's successful calls have shown."""

    def record_evidence(
        self, tenant: str, task_id: str, name: str, *, source: str
    ) -> EvidenceRecord:
        """Record it once; recording the same name again keeps (and returns) the first."""
        record = _validated(
            EvidenceRecord,
            {
                "tenant": tenant,
                "task_id": task_id,
                "name": name,
                "source": source,
                "recorded_at": self.now,
            },
            "evidence",
        )
        self._tenant_row(tenant)
        key = {"tenant": tenant, "task": task_id, "name": name}
        self._run(
            "INSERT INTO evidence (tenant, task_id, name, source, recorded_at) VALUES "
            "(:tenant, :task, :name, :source, :now) ON CONFLICT DO NOTHING",
            {**key, "source": record.source, "now": self._at},
        )
        row = self._row(
            f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE tenant = :tenant AND "
            "task_id = :task AND name = :name",
            key,
        )
        if row is None:  # pragma: no cover - inserted or present in this transaction
            raise StoreError("evidence vanished while it was recorded")
        return _evidence(row)

    def evidence(self, tenant: str, task_id: str) -> set[str]:
        """The names of the evidence recorded for the task."""
        rows = self._rows(
            "SELECT name FROM evidence WHERE tenant = :tenant AND task_id = :task",
            {"tenant": tenant, "task": task_id},
        )
        return {row["name"] for row in rows}
