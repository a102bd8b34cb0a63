"""Webhook notices in the database: each tenant's cursor, and each delivery.

The ledger is the notices' outbox (:mod:`capgate.gateway.service.notices`): a
notifier reads a tenant's rows after its cursor, in ``seq`` order, and moves the
cursor past a notice only in the transaction that records the notice delivered or
failed, so a crash in between sends it again, never loses it. Reading by ``seq``
misses nothing, because a ledger append holds the ledger lock until its transaction
ends: rows commit in ``seq`` order, and a reader's snapshot always holds every row
up to some ``seq``.

One notifier at a time holds a tenant's cursor: a conditional ``UPDATE`` takes a
free or lapsed hold (a notifier that died), so however many processes race, one
wins, and a notifier that lost its hold moves nothing.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists); values always travel as bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, quote
from capgate.gateway.state.records import (
    NoticeAttempt,
    NoticeCursor,
    NoticeDelivery,
    NoticeStatus,
)
from capgate.gateway.state.sql.core import TxCore, _identifier, _stored, _time, _validated
from capgate.gateway.state.times import to_text

__all__ = ["NoticesTx"]

_CURSOR_COLUMNS: Final = "tenant, after_seq, claimed_by, claim_until, updated_at"
_DELIVERY_COLUMNS: Final = (
    "event_id, tenant, seq, event, proposal_id, status, attempts, last_result, "
    "created_at, updated_at"
)
_ATTEMPT_COLUMNS: Final = "event_id, attempt, at, result, status_code"
_MAX_NOTIFIER: Final = 256


def _cursor(row: Mapping[str, Any]) -> NoticeCursor:
    return _stored(
        NoticeCursor,
        {**row, "claim_until": _time(row["claim_until"]), "updated_at": _time(row["updated_at"])},
        "notice cursor",
    )


def _delivery(row: Mapping[str, Any]) -> NoticeDelivery:
    return _stored(
        NoticeDelivery,
        {**row, "created_at": _time(row["created_at"]), "updated_at": _time(row["updated_at"])},
        "notice delivery",
    )


def _notifier(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NOTIFIER:
        raise InvalidInput(
            f"a notifier is named by 1 to {_MAX_NOTIFIER} characters, not {quote(name)}"
        )
    return name


class NoticesTx(TxCore):
    """Notice cursors and deliveries: see the module docstring."""

    def claim_notices(self, tenant: str, notifier: str, *, claim: timedelta) -> NoticeCursor | None:
        tenant = _identifier(tenant, "tenant")
        notifier = _notifier(notifier)
        if not isinstance(claim, timedelta) or claim <= timedelta(0):
            raise InvalidInput("a claim lasts a positive timedelta")
        last = self._row("SELECT MAX(seq) AS seq FROM ledger")
        start = 0 if last is None or last["seq"] is None else int(last["seq"])
        self._run(
            f"INSERT INTO notice_cursors ({_CURSOR_COLUMNS}) VALUES (:tenant, :start, NULL, "
            "NULL, :now) ON CONFLICT (tenant) DO NOTHING",
            {"tenant": tenant, "start": start, "now": self._at},
        )
        changed = self._run(
            "UPDATE notice_cursors SET claimed_by = :me, claim_until = :until, updated_at = :now "
            "WHERE tenant = :tenant AND (claimed_by IS NULL OR claimed_by = :me "
            "OR claim_until <= :now)",
            {
                "tenant": tenant,
                "me": notifier,
                "until": to_text(self.now + claim),
                "now": self._at,
            },
        )
        if changed != 1:
            return None
        row = self._row(
            f"SELECT {_CURSOR_COLUMNS} FROM notice_cursors WHERE tenant = :tenant",
            {"tenant": tenant},
        )
        assert row is not None  # inserted now, or before
        return _cursor(row)

    def advance_notices(self, tenant: str, notifier: str, after_seq: int) -> bool:
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            raise InvalidInput(f"a cursor is a ledger sequence number, not {quote(after_seq)}")
        held = self._run(
            "UPDATE notice_cursors SET after_seq = CASE WHEN after_seq < :seq THEN :seq "
            "ELSE after_seq END, updated_at = :now WHERE tenant = :tenant AND claimed_by = :me",
            {"tenant": tenant, "me": _notifier(notifier), "seq": after_seq, "now": self._at},
        )
        return held == 1

    def release_notices(self, tenant: str, notifier: str) -> None:
        self._run(
            "UPDATE notice_cursors SET claimed_by = NULL, claim_until = NULL, updated_at = :now "
            "WHERE tenant = :tenant AND claimed_by = :me",
            {"tenant": tenant, "me": _notifier(notifier), "now": self._at},
        )

    def record_notice_attempt(
        self,
        delivery: NoticeDelivery,
        *,
        result: str,
        status_code: int | None,
    ) -> NoticeDelivery:
        given = _validated(NoticeDelivery, delivery.model_dump(), "notice delivery")
        attempt = _validated(
            NoticeAttempt,
            {
                "event_id": given.event_id,
                "attempt": 1,
                "at": self.now,
                "result": result,
                "status_code": status_code,
            },
            "notice attempt",
        )
        current = self.get_notice(given.event_id, for_update=True)
        if current is None:
            number = 1
            self._run(
                f"INSERT INTO notice_deliveries ({_DELIVERY_COLUMNS}) VALUES (:event_id, "
                ":tenant, :seq, :event, :proposal_id, :status, 1, :result, :now, :now)",
                {
                    "event_id": given.event_id,
                    "tenant": given.tenant,
                    "seq": given.seq,
                    "event": given.event,
                    "proposal_id": given.proposal_id,
                    "status": given.status.value,
                    "result": attempt.result,
                    "now": self._at,
                },
            )
        else:
            number = current.attempts + 1
            # A final status stays final: a stalled sender's late attempt changes
            # the count and the last result, never delivered back into sending.
            status = current.status if current.status is not NoticeStatus.SENDING else given.status
            self._run(
                "UPDATE notice_deliveries SET status = :status, attempts = :attempts, "
                "last_result = :result, updated_at = :now WHERE event_id = :event_id",
                {
                    "event_id": given.event_id,
                    "status": status.value,
                    "attempts": number,
                    "result": attempt.result,
                    "now": self._at,
                },
            )
        self._run(
            f"INSERT INTO notice_attempts ({_ATTEMPT_COLUMNS}) VALUES (:event_id, :attempt, "
            ":at, :result, :status_code)",
            {
                "event_id": given.event_id,
                "attempt": number,
                "at": self._at,
                "result": attempt.result,
                "status_code": attempt.status_code,
            },
        )
        stored = self.get_notice(given.event_id)
        assert stored is not None
        return stored

    def get_notice(self, event_id: str, *, for_update: bool = False) -> NoticeDelivery | None:
        row = self._row(
            f"SELECT {_DELIVERY_COLUMNS} FROM notice_deliveries WHERE event_id = :event_id"
            f"{self._locked(for_update)}",
            {"event_id": event_id},
        )
        return None if row is None else _delivery(row)

    def notices(
        self, *, tenant: str | None = None, status: NoticeStatus | None = None
    ) -> list[NoticeDelivery]:
        where: list[str] = []
        params: dict[str, Any] = {}
        if tenant is not None:
            where.append("tenant = :tenant")
            params["tenant"] = tenant
        if status is not None:
            where.append("status = :status")
            params["status"] = NoticeStatus(status).value
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._rows(
            f"SELECT {_DELIVERY_COLUMNS} FROM notice_deliveries{clause} ORDER BY seq, event_id",
            params,
        )
        return [_delivery(row) for row in rows]

    def notice_attempts(self, event_id: str) -> list[NoticeAttempt]:
        rows = self._rows(
            f"SELECT {_ATTEMPT_COLUMNS} FROM notice_attempts WHERE event_id = :event_id "
            "ORDER BY attempt",
            {"event_id": event_id},
        )
        return [
            _stored(NoticeAttempt, {**row, "at": _time(row["at"])}, "notice attempt")
            for row in rows
        ]
