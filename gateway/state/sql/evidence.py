"""The evidence a task has recorded, which other contracts' ``requires`` read.

A piece of evidence is a name about a subject (the call's subject, or one of its
declared values; none for evidence recorded before schema version 8, stored as empty
strings so that the key stays one primary key on both backends), with an optional
expiry. It is written once per name and subject: a second recording keeps the first
(two calls that produce it at once both succeed and agree on its source and time),
unless the first expires before the second would, which renews it. So shown again,
evidence lasts longer, never shorter.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from capgate.gateway.errors import StoreError
from capgate.gateway.model.facts import EvidenceSubject
from capgate.gateway.state.records import EvidenceRecord
from capgate.gateway.state.sql.core import TxCore, _stored, _time, _validated
from capgate.gateway.state.times import to_text

__all__ = ["EvidenceTx"]

_EVIDENCE_COLUMNS: Final = (
    "tenant, task_id, name, source, recorded_at, subject_type, subject_id, expires_at"
)


def _evidence(row: Mapping[str, Any]) -> EvidenceRecord:
    subject = None
    if row["subject_type"] or row["subject_id"]:
        subject = {"type": row["subject_type"], "id": row["subject_id"]}
    return _stored(
        EvidenceRecord,
        {
            "tenant": row["tenant"],
            "task_id": row["task_id"],
            "name": row["name"],
            "source": row["source"],
            "recorded_at": _time(row["recorded_at"]),
            "subject": subject,
            "expires_at": _time(row["expires_at"]),
        },
        "evidence",
    )


class EvidenceTx(TxCore):
    """Evidence: what a task's successful calls have shown, and about what."""

    def record_evidence(
        self,
        tenant: str,
        task_id: str,
        name: str,
        *,
        source: str,
        subject: EvidenceSubject | None = None,
        expires_at: datetime | None = None,
    ) -> EvidenceRecord:
        """Record it once per name and subject; recording it again keeps (and returns)
        the first, unless that expires before this one would: then this replaces it."""
        record = _validated(
            EvidenceRecord,
            {
                "tenant": tenant,
                "task_id": task_id,
                "name": name,
                "source": source,
                "recorded_at": self.now,
                "subject": subject.model_dump()
                if isinstance(subject, EvidenceSubject)
                else subject,
                "expires_at": expires_at,
            },
            "evidence",
        )
        self._tenant_row(tenant)
        key = {
            "tenant": tenant,
            "task": task_id,
            "name": name,
            "stype": record.subject.type if record.subject else "",
            "sid": record.subject.id if record.subject else "",
        }
        expires = None if record.expires_at is None else to_text(record.expires_at, "expires_at")
        # Renewed only by a later expiry (NULL: never expires, the latest of all); the
        # stored form of times compares as text in time order.
        self._run(
            "INSERT INTO evidence (tenant, task_id, name, source, recorded_at, subject_type, "
            "subject_id, expires_at) VALUES (:tenant, :task, :name, :source, :now, :stype, "
            ":sid, :expires) ON CONFLICT (tenant, task_id, name, subject_type, subject_id) "
            "DO UPDATE SET source = excluded.source, recorded_at = excluded.recorded_at, "
            "expires_at = excluded.expires_at WHERE evidence.expires_at IS NOT NULL AND "
            "(excluded.expires_at IS NULL OR excluded.expires_at > evidence.expires_at)",
            {**key, "source": record.source, "now": self._at, "expires": expires},
        )
        row = self._row(
            f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE tenant = :tenant AND "
            "task_id = :task AND name = :name AND subject_type = :stype AND subject_id = :sid",
            key,
        )
        if row is None:  # pragma: no cover - inserted or present in this transaction
            raise StoreError("evidence vanished while it was recorded")
        return _evidence(row)

    def evidence(self, tenant: str, task_id: str) -> set[str]:
        """The names of the evidence recorded for the task (any subject, any expiry)."""
        rows = self._rows(
            "SELECT name FROM evidence WHERE tenant = :tenant AND task_id = :task",
            {"tenant": tenant, "task": task_id},
        )
        return {row["name"] for row in rows}

    def evidence_records(self, tenant: str, task_id: str) -> list[EvidenceRecord]:
        """Every piece of evidence recorded for the task, by name and subject."""
        rows = self._rows(
            f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE tenant = :tenant AND task_id = :task",
            {"tenant": tenant, "task": task_id},
        )
        # Ordered here, not by the backends' collations: the same input on both.
        keyed = sorted(rows, key=lambda r: (r["name"], r["subject_type"], r["subject_id"]))
        return [_evidence(row) for row in keyed]
