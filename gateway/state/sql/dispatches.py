"""The dispatch queue: approved proposals waiting for an execution worker.

A job is queued in the transaction that approves its proposal, so no approval can
be committed without one. Workers claim jobs with a lease: the claim is a
conditional ``UPDATE`` of a job that is due and not claimed (or whose claim is over),
so however many workers race, each job goes to one of them; on PostgreSQL the
candidates are read ``FOR UPDATE SKIP LOCKED``, so racing claims take different
jobs instead of queueing behind each other's row locks. Settling a job is
conditional on its claim too: a worker whose claim was taken over (it stalled past
its lease) changes nothing. Queuing a job, and giving one back due at once, notify
the ``dispatch`` channel.

The queue says who may try a dispatch next, not whether it may happen: that is
still OPA's decision at dispatch, and an operation is run at most once whatever the
queue says (:mod:`capgate.gateway.service.operations`).
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, UnknownProposal, quote
from capgate.gateway.state.records import DispatchJob, DispatchStatus
from capgate.gateway.state.sql.core import TxCore, _stored, _time
from capgate.gateway.state.times import to_text

__all__ = ["DispatchesTx"]

_JOB_COLUMNS: Final = (
    "proposal_id, tenant, status, not_before, claimed_by, claim_until, tries, last_result, "
    "created_at, updated_at"
)
#: Due and not held by a live claim (``:now`` is the transaction's clock).
_CLAIMABLE: Final = (
    "status = 'queued' AND not_before <= :now AND (claim_until IS NULL OR claim_until <= :now)"
)
#: The most jobs one claim takes.
MAX_CLAIM: Final = 1000
#: The longest a worker name and a result may be (they are kept and logged).
_MAX_WORKER: Final = 256
_MAX_RESULT: Final = 512


def _job(row: Mapping[str, Any]) -> DispatchJob:
    return _stored(
        DispatchJob,
        {
            **row,
            "not_before": _time(row["not_before"]),
            "claim_until": _time(row["claim_until"]),
            "created_at": _time(row["created_at"]),
            "updated_at": _time(row["updated_at"]),
        },
        "dispatch job",
    )


def _worker(worker: object) -> str:
    if not isinstance(worker, str) or not 0 < len(worker) <= _MAX_WORKER:
        raise InvalidInput(
            f"a worker is named by 1 to {_MAX_WORKER} characters, not {quote(worker)}"
        )
    return worker


def _claim_length(claim: object) -> timedelta:
    if not isinstance(claim, timedelta) or claim <= timedelta(0):
        raise InvalidInput("a claim lasts a positive timedelta")
    return claim


class DispatchesTx(TxCore):
    """The dispatch queue: see the module docstring."""

    def queue_dispatch(self, proposal_id: str) -> DispatchJob:
        proposal = self._row("SELECT id, tenant FROM proposals WHERE id = :id", {"id": proposal_id})
        if proposal is None:
            raise UnknownProposal(proposal_id)
        inserted = self._run(
            f"INSERT INTO dispatch_queue ({_JOB_COLUMNS}) VALUES (:id, :tenant, 'queued', "
            ":now, NULL, NULL, 0, NULL, :now, :now) ON CONFLICT (proposal_id) DO NOTHING",
            {"id": proposal["id"], "tenant": proposal["tenant"], "now": self._at},
        )
        if inserted == 1:
            self.notify("dispatch")
        job = self.get_dispatch(proposal_id)
        assert job is not None  # inserted now, or before
        return job

    def get_dispatch(self, proposal_id: str) -> DispatchJob | None:
        row = self._row(
            f"SELECT {_JOB_COLUMNS} FROM dispatch_queue WHERE proposal_id = :id",
            {"id": proposal_id},
        )
        return None if row is None else _job(row)

    def claim_dispatches(self, worker: str, *, limit: int, claim: timedelta) -> list[DispatchJob]:
        worker = _worker(worker)
        until = to_text(self.now + _claim_length(claim))
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_CLAIM:
            raise InvalidInput(f"a claim takes 1 to {MAX_CLAIM} jobs, not {quote(limit)}")
        candidates = self._rows(
            f"SELECT proposal_id FROM dispatch_queue WHERE {_CLAIMABLE} "
            f"ORDER BY not_before, n LIMIT :limit{self._dialect.for_update_skip_locked}",
            {"now": self._at, "limit": limit},
        )
        claimed: list[DispatchJob] = []
        for candidate in candidates:
            params = {"id": candidate["proposal_id"], "worker": worker, "until": until}
            changed = self._run(
                "UPDATE dispatch_queue SET claimed_by = :worker, claim_until = :until, "
                f"tries = tries + 1, updated_at = :now WHERE proposal_id = :id AND {_CLAIMABLE}",
                {**params, "now": self._at},
            )
            if changed == 1:
                job = self.get_dispatch(candidate["proposal_id"])
                assert job is not None
                claimed.append(job)
        return claimed

    def renew_dispatches(
        self, worker: str, proposal_ids: list[str], *, claim: timedelta
    ) -> list[str]:
        worker = _worker(worker)
        until = to_text(self.now + _claim_length(claim))
        renewed = []
        for proposal_id in proposal_ids:
            changed = self._run(
                "UPDATE dispatch_queue SET claim_until = :until, updated_at = :now "
                "WHERE proposal_id = :id AND claimed_by = :worker AND status = 'queued'",
                {"id": proposal_id, "worker": worker, "until": until, "now": self._at},
            )
            if changed == 1:
                renewed.append(proposal_id)
        return renewed

    def settle_dispatch(
        self,
        proposal_id: str,
        worker: str,
        *,
        status: DispatchStatus,
        result: str | None,
        not_before: datetime | None = None,
    ) -> DispatchJob | None:
        worker = _worker(worker)
        status = DispatchStatus(status)
        if result is not None and (not isinstance(result, str) or len(result) > _MAX_RESULT):
            raise InvalidInput(f"a job's result is at most {_MAX_RESULT} characters of text")
        due = self.now if not_before is None else max(not_before, self.now)
        changed = self._run(
            "UPDATE dispatch_queue SET status = :status, not_before = :due, claimed_by = NULL, "
            "claim_until = NULL, last_result = :result, updated_at = :now "
            "WHERE proposal_id = :id AND claimed_by = :worker",
            {
                "id": proposal_id,
                "worker": worker,
                "status": status.value,
                "due": to_text(due, "not_before"),
                "result": result,
                "now": self._at,
            },
        )
        if changed != 1:
            return None
        if status is DispatchStatus.QUEUED and due <= self.now:
            self.notify("dispatch")
        return self.get_dispatch(proposal_id)

    def next_dispatch_due(self) -> datetime | None:
        row = self._row(
            "SELECT MIN(CASE WHEN claim_until IS NOT NULL AND claim_until > not_before "
            "THEN claim_until ELSE not_before END) AS due FROM dispatch_queue "
            "WHERE status = 'queued'"
        )
        return None if row is None else _time(row["due"])

    def dispatches(
        self, *, status: DispatchStatus | None = None, tenant: str | None = None
    ) -> list[DispatchJob]:
        where: list[str] = []
        params: dict[str, Any] = {}
        if status is not None:
            where.append("status = :status")
            params["status"] = DispatchStatus(status).value
        if tenant is not None:
            where.append("tenant = :tenant")
            params["tenant"] = tenant
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._rows(f"SELECT {_JOB_COLUMNS} FROM dispatch_queue{clause} ORDER BY n", params)
        return [_job(row) for row in rows]
