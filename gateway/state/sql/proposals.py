"""Proposals and their reviews: a call that waits for a person, and the answer.

One module, because a review belongs to one proposal and is inserted only if that
proposal exists. An approval grants one run: it is consumed with a conditional
``UPDATE ... WHERE consumed_at IS NULL``, so the first writer changes the row and
every later one changes nothing. Whether it has expired is not asked here: OPA's
clock decides that, at the decision the consumption belongs to.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import (
    DuplicateOperation,
    DuplicateRecord,
    UnknownProposal,
    UnknownReview,
)
from capgate.gateway.state.records import (
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)
from capgate.gateway.state.sql.core import TxCore, _dump, _load, _stored, _time, _validated
from capgate.gateway.state.times import to_text

__all__ = ["ProposalsTx"]

_PROPOSAL_COLUMNS: Final = (
    "id, tenant, task_id, proposer, environment, task, tool, contract_version, "
    "execution_action, params, params_digest, operation_id, decision_id, status, "
    "reason_codes, created_at, updated_at, unsettled_twins"
)
_REVIEW_COLUMNS: Final = (
    "id, proposal_id, reviewer, verdict, kind, tenant, tool, operation_id, digest, "
    "expires_at, consumed_at, decision_id, created_at, comment"
)


def _proposal(row: Mapping[str, Any]) -> ProposalRecord:
    return _stored(
        ProposalRecord,
        {
            **row,
            "proposer": _load(row["proposer"], "proposal proposer"),
            "task": _load(row["task"], "proposal task"),
            "params": _load(row["params"], "proposal params"),
            "reason_codes": _load(row["reason_codes"], "proposal reason codes"),
            "unsettled_twins": _load(row["unsettled_twins"], "proposal unsettled twins"),
            "created_at": _time(row["created_at"]),
            "updated_at": _time(row["updated_at"]),
        },
        "proposal",
    )


def _review(row: Mapping[str, Any]) -> ReviewRecord:
    return _stored(
        ReviewRecord,
        {
            **row,
            "reviewer": _load(row["reviewer"], "review reviewer"),
            "expires_at": _time(row["expires_at"]),
            "consumed_at": _time(row["consumed_at"]),
            "created_at": _time(row["created_at"]),
        },
        "review",
    )


def _proposal_params(p: ProposalRecord) -> dict[str, Any]:
    return {
        "id": p.id,
        "tenant": p.tenant,
        "task_id": p.task_id,
        "proposer": _dump(p.proposer.model_dump(mode="json")),
        "environment": p.environment,
        "task": _dump(p.task),
        "tool": p.tool,
        "contract_version": p.contract_version,
        "execution_action": p.execution_action,
        "params": _dump(p.params),
        "params_digest": p.params_digest,
        "operation_id": p.operation_id,
        "decision_id": p.decision_id,
        "status": p.status.value,
        "reason_codes": _dump(p.reason_codes),
        "created_at": to_text(p.created_at, "created_at"),
        "updated_at": to_text(p.updated_at, "updated_at"),
        "unsettled_twins": _dump(p.unsettled_twins),
    }


class ProposalsTx(TxCore):
    """Proposals and reviews: calls that wait for a person, and what people said."""

    def insert_proposal(self, proposal: ProposalRecord) -> ProposalRecord:
        """``DuplicateOperation`` if the tenant already has a proposal for that id,
        ``DuplicateRecord`` if a proposal has that id."""
        record = _validated(ProposalRecord, proposal.model_dump(), "proposal")
        self._tenant_row(record.tenant)
        inserted = self._run(
            f"INSERT INTO proposals ({_PROPOSAL_COLUMNS}) VALUES (:id, :tenant, :task_id, "
            ":proposer, :environment, :task, :tool, :contract_version, :execution_action, "
            ":params, :params_digest, :operation_id, :decision_id, :status, :reason_codes, "
            ":created_at, :updated_at, :unsettled_twins) ON CONFLICT DO NOTHING",
            _proposal_params(record),
        )
        if inserted == 1:
            return record
        if self._row("SELECT id FROM proposals WHERE id = :id", {"id": record.id}) is not None:
            raise DuplicateRecord("proposal", record.id)
        raise DuplicateOperation(record.tenant, record.operation_id)

    def get_proposal(self, proposal_id: str, *, for_update: bool = False) -> ProposalRecord | None:
        row = self._row(
            f"SELECT {_PROPOSAL_COLUMNS} FROM proposals WHERE id = :id{self._locked(for_update)}",
            {"id": proposal_id},
        )
        return None if row is None else _proposal(row)

    def proposal_for_operation(self, tenant: str, operation_id: str) -> ProposalRecord | None:
        row = self._row(
            f"SELECT {_PROPOSAL_COLUMNS} FROM proposals "
            "WHERE tenant = :tenant AND operation_id = :operation_id",
            {"tenant": tenant, "operation_id": operation_id},
        )
        return None if row is None else _proposal(row)

    def update_proposal(
        self, proposal_id: str, *, status: ProposalStatus, reason_codes: list[str]
    ) -> ProposalRecord:
        """Set status and reason codes (``updated_at`` becomes ``now``);
        ``UnknownProposal`` if there is none."""
        current = self.get_proposal(proposal_id, for_update=True)
        if current is None:
            raise UnknownProposal(proposal_id)
        record = _validated(
            ProposalRecord,
            {
                **current.model_dump(),
                "status": status,
                "reason_codes": reason_codes,
                "updated_at": self.now,
            },
            "proposal",
        )
        self._run(
            "UPDATE proposals SET status = :status, reason_codes = :reason_codes, "
            "updated_at = :now WHERE id = :id",
            {
                "id": proposal_id,
                "status": record.status.value,
                "reason_codes": _dump(record.reason_codes),
                "now": self._at,
            },
        )
        return record

    def list_proposals(
        self, *, tenant: str | None = None, status: ProposalStatus | None = None
    ) -> list[ProposalRecord]:
        """Proposals in the order they were inserted, filtered by tenant and status."""
        where: list[str] = []
        params: dict[str, Any] = {}
        if tenant is not None:
            where.append("tenant = :tenant")
            params["tenant"] = tenant
        if status is not None:
            where.append("status = :status")
            params["status"] = ProposalStatus(status).value
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._rows(f"SELECT {_PROPOSAL_COLUMNS} FROM proposals{clause} ORDER BY n", params)
        return [_proposal(row) for row in rows]

    def insert_review(self, review: ReviewRecord) -> ReviewRecord:
        """``UnknownProposal`` if the proposal does not exist, ``DuplicateRecord`` if a
        review has that id."""
        record = _validated(ReviewRecord, review.model_dump(), "review")
        if self._row("SELECT id FROM proposals WHERE id = :id", {"id": record.proposal_id}) is None:
            raise UnknownProposal(record.proposal_id)
        inserted = self._run(
            f"INSERT INTO reviews ({_REVIEW_COLUMNS}) VALUES (:id, :proposal_id, :reviewer, "
            ":verdict, :kind, :tenant, :tool, :operation_id, :digest, :expires_at, "
            ":consumed_at, :decision_id, :created_at, :comment) ON CONFLICT DO NOTHING",
            {
                "id": record.id,
                "proposal_id": record.proposal_id,
                "reviewer": _dump(record.reviewer.model_dump(mode="json")),
                "verdict": record.verdict.value,
                "kind": record.kind,
                "tenant": record.tenant,
                "tool": record.tool,
                "operation_id": record.operation_id,
                "digest": record.digest,
                "expires_at": to_text(record.expires_at),
                "consumed_at": None if record.consumed_at is None else to_text(record.consumed_at),
                "decision_id": record.decision_id,
                "created_at": to_text(record.created_at),
                "comment": record.comment,
            },
        )
        if inserted != 1:
            raise DuplicateRecord("review", record.id)
        return record

    def reviews(self, proposal_id: str) -> list[ReviewRecord]:
        """Every review of the proposal, oldest (first inserted) first."""
        rows = self._rows(
            f"SELECT {_REVIEW_COLUMNS} FROM reviews WHERE proposal_id = :id ORDER BY n",
            {"id": proposal_id},
        )
        return [_review(row) for row in rows]

    def consume_review(self, review_id: str) -> bool:
        """Mark an approval used at ``now``; False if it was used already (or is a
        rejection, which grants nothing); ``UnknownReview`` if there is none.

        Expiry is not checked here: OPA's clock decides whether an approval is
        still valid, at the decision this consumption belongs to.
        """
        changed = self._run(
            "UPDATE reviews SET consumed_at = :now WHERE id = :id AND consumed_at IS NULL "
            "AND verdict = :approved",
            {"id": review_id, "now": self._at, "approved": ReviewVerdict.APPROVED.value},
        )
        if changed == 1:
            return True
        if self._row("SELECT id FROM reviews WHERE id = :id", {"id": review_id}) is None:
            raise UnknownReview(review_id)
        return False
