"""Proposals and reviews: what a reviewed call becomes, and a person's verdict on it.

A tool whose calls are reviewed is not run when an agent calls it: the exact
content and recipient are frozen into a proposal (with the operation id that will
carry it, and the unsettled operations of the same content it may repeat). A
reviewer's verdict is itself an OPA decision (``capgate/review``), and an approval
binds the proposal's digest, operation and tenant until it expires, and queues the
proposal for the execution workers in the same transaction
(:mod:`capgate.gateway.service.worker`). Dispatching an approved proposal is the
gateway's (:meth:`Gateway.dispatch`), which asks OPA again with the facts of that
moment; a denial then blocks the proposal here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

from capgate.gateway.enforce.arguments import values_of
from capgate.gateway.enforce.dispatcher import PolicyDecider, policy_revision
from capgate.gateway.enforce.grant import Authorised
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    DuplicateOperation,
    InvalidInput,
    OperationConflict,
    PolicyUnavailable,
    ProposalStale,
    StoreBusy,
    UnknownProposal,
    quote,
)
from capgate.gateway.model.comments import review_comment
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Reason, ReviewDecision
from capgate.gateway.model.facts import Approval, Approver, Reviewer, ReviewInput
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.service.ledger import append, entry, reviewer_detail, reviewer_name, who
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import (
    LedgerEntry,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)
from capgate.gateway.state.store import Store, Tx

__all__ = [
    "AWAITING_QUORUM",
    "DEFAULT_APPROVAL_TTL",
    "MAX_APPROVAL_TTL",
    "Proposals",
    "QuorumProgress",
    "ReviewPolicy",
    "approval_fact",
    "approvals_of",
    "block",
    "latest_approval",
    "person_of",
    "quorum_progress",
    "read_proposal",
    "standing_approvers",
]

log = logging.getLogger("capgate.service")

#: How long an approval stays good for its one dispatch, unless the reviewer says.
DEFAULT_APPROVAL_TTL: Final = timedelta(hours=24)
#: The longest an approval may be given for: a year. Longer is a mistake (and far
#: enough out, an expiry the calendar cannot hold).
MAX_APPROVAL_TTL: Final = timedelta(days=366)
#: The ledger outcome of an approval short of the contract's quorum: recorded, and
#: the proposal stays pending until enough distinct reviewers approve.
AWAITING_QUORUM: Final = "awaiting_quorum"
#: How often a review is asked again when other approvals keep changing the count
#: before it is recorded; past that, StoreBusy (review again).
_REVIEW_ROUNDS: Final = 5


class ReviewPolicy(PolicyDecider, Protocol):
    """A policy decider that also answers the review question (``PolicyClient`` does)."""

    def review(self, facts: ReviewInput) -> ReviewDecision: ...


class _Stale(Exception):
    """Raised inside the review's transaction (rolling it back) when the approvals
    standing differ from those the review policy counted: it is asked again."""


class _Lost(Exception):
    """Raised inside the review's transaction (rolling it back) when a concurrent
    review of the same proposal committed first."""


class Proposals:
    """Proposes reviewed calls and records reviews, for one gateway's store and policy."""

    def __init__(
        self,
        store: Store,
        catalogue: Catalogue,
        policy: ReviewPolicy,
        *,
        approval_ttl: timedelta,
    ) -> None:
        self.store = store
        self.catalogue = catalogue
        self.policy = policy
        self.approval_ttl = approval_ttl

    def propose(self, authorised: Authorised, request: AgentRequest) -> ProposalRecord:
        with self.store.transaction() as tx:
            stored, twins = self._write_proposal(tx, authorised, request)
        self._log_proposed(stored, twins)
        return stored

    def migrate(
        self, old: ProposalRecord, authorised: Authorised, request: AgentRequest, *, by: Reviewer
    ) -> ProposalRecord:
        """Move ``old`` (pending or approved, under an earlier contract version) to
        today's version, in one transaction: ``old`` is blocked (``proposal_migrated``,
        its approvals void with it) and its call proposed afresh under today's contract
        as ``authorised`` allowed it, pending a new review, with a ``migration`` ledger
        row naming both and ``by``. ProposalStale when ``old`` changed since it was read
        (reviewed, dispatched, migrated by someone else): nothing is written."""
        with self.store.transaction() as tx:
            current = tx.get_proposal(old.id, for_update=True)
            if current is None or (current.status, current.contract_version) != (
                old.status,
                old.contract_version,
            ):
                raise ProposalStale(old.id)
            tx.update_proposal(
                old.id, status=ProposalStatus.BLOCKED, reason_codes=["proposal_migrated"]
            )
            stored, twins = self._write_proposal(tx, authorised, request)
            tx.append(
                LedgerEntry(
                    kind="migration",
                    tenant=old.tenant,
                    principal=reviewer_name(by),
                    tool=old.tool,
                    contract_version=old.contract_version,
                    operation_id=old.operation_id,
                    proposal_id=old.id,
                    decision_id=authorised.decision_id,
                    policy_revision=authorised.revision,
                    outcome="migrated",
                    detail={
                        "to": stored.id,
                        "to_operation": stored.operation_id,
                        "to_version": stored.contract_version,
                        "from_status": old.status.value,
                        **reviewer_detail(by),
                    },
                )
            )
        log.info("migrated proposal=%s to=%s version %d -> %d by=%s", old.id, stored.id,
                 old.contract_version, stored.contract_version, by.id)  # fmt: skip
        self._log_proposed(stored, twins)
        return stored

    def _write_proposal(
        self, tx: Tx, authorised: Authorised, request: AgentRequest
    ) -> tuple[ProposalRecord, list[str] | None]:
        """Write the proposal ``authorised`` allowed, with its ledger row, in ``tx``:
        the proposal and its unsettled twins, or the proposal its operation id already
        made and None (nothing written)."""
        contract = authorised.contract
        # The same content as an operation whose outcome is still open (running, or
        # unknown until looked up): approving this one may do it a second time. The
        # proposal says so, to the agent and to its reviewers.
        twins = [
            twin
            for twin in tx.unsettled_twins(
                request.tenant, contract.name, authorised.prepared.digest
            )
            if twin != authorised.operation_id
        ]
        proposal = ProposalRecord(
            id=f"prop-{uuid.uuid4().hex[:20]}",
            tenant=request.tenant,
            task_id=request.task_id,
            proposer=request.principal,
            environment=request.environment,
            task=request.task.model_dump(mode="json"),
            tool=contract.name,
            contract_version=contract.version,
            execution_action=contract.dispatch_action,
            params=authorised.prepared.params,
            params_digest=authorised.prepared.digest,
            operation_id=authorised.operation_id,
            decision_id=authorised.decision_id,
            status=ProposalStatus.PENDING,
            created_at=tx.now,
            updated_at=tx.now,
            unsettled_twins=twins,
        )
        # An id some call already used would only collide at dispatch, after a
        # person reviewed the proposal: refuse it now.
        used = tx.get_operation(request.tenant, authorised.operation_id)
        if used is not None and (used.tool, used.params_digest) != (
            proposal.tool,
            proposal.params_digest,
        ):
            raise OperationConflict(
                f"operation {quote(authorised.operation_id)} was used for another call "
                "(tool or parameters differ); use a new operation id"
            )
        try:
            stored = tx.insert_proposal(proposal)
        except DuplicateOperation:
            stored = None
        if stored is None:
            existing = tx.proposal_for_operation(request.tenant, authorised.operation_id)
            if existing is None or (existing.tool, existing.params_digest) != (
                proposal.tool,
                proposal.params_digest,
            ):
                raise OperationConflict(
                    f"operation {quote(authorised.operation_id)} was already proposed "
                    "with other parameters"
                ) from None
            return existing, []
        tx.append(
            entry(
                "proposal",
                authorised,
                proposal_id=stored.id,
                outcome=stored.status.value,
                detail={
                    "task": request.task_id,
                    "params_digest": stored.params_digest,
                    "authenticated_by": request.authenticated_by or "library",
                    **({"unsettled_twins": twins} if twins else {}),
                },
            )
        )
        return stored, twins

    @staticmethod
    def _log_proposed(stored: ProposalRecord, twins: list[str] | None) -> None:
        if twins is None:  # proposed before, under this operation id: nothing new
            return
        log.info(
            "proposed tool=%s proposal=%s operation=%s decision=%s",
            stored.tool,
            stored.id,
            stored.operation_id,
            stored.decision_id,
        )
        if twins:
            log.warning(
                "proposal=%s has the content of unsettled operation(s) %s: approving it may "
                "repeat what they did",
                stored.id,
                ",".join(twins),
            )

    def review(
        self,
        proposal_id: str,
        reviewer: Reviewer,
        verdict: ReviewVerdict | str,
        *,
        ttl: timedelta | None = None,
        comment: str | None = None,
    ) -> ReviewRecord:
        """A reviewer approves or rejects a pending proposal, if OPA says they may.

        ``reviewer`` is an authenticated identity (a front's: never a name from a
        request). Raises UnknownProposal, CapabilityViolation (the review policy's
        reasons, e.g. self_review or reviewer_not_permitted) or PolicyUnavailable; an
        approval binds the proposal's digest, operation and tenant and expires after
        ``ttl``. Every verdict, given or refused, is a ledger row naming the
        reviewer's id and how they were authenticated.

        ``comment`` is kept with the review for people (the rule of
        :mod:`capgate.gateway.model.comments`; a bad one is InvalidInput before OPA
        is asked). OPA is not shown it, the log does not name it, and the ledger
        row says only whether there was one (``commented``).
        """
        if not isinstance(reviewer, Reviewer):
            raise InvalidInput(
                f"reviewer must be a Reviewer (an authenticated identity), not a "
                f"{type(reviewer).__name__}"
            )
        try:
            verdict = ReviewVerdict(verdict)
        except ValueError:
            raise InvalidInput(
                f"verdict {quote(str(verdict), 40)} is not 'approved' or 'rejected'"
            ) from None
        ttl = self.approval_ttl if ttl is None else ttl
        if not isinstance(ttl, timedelta):
            raise InvalidInput(f"ttl must be a timedelta or None, not a {type(ttl).__name__}")
        if ttl <= timedelta(0) or ttl > MAX_APPROVAL_TTL:
            raise InvalidInput(
                f"an approval's time to live must be positive and at most "
                f"{MAX_APPROVAL_TTL.days} days"
            )
        comment = review_comment(comment)
        for _ in range(_REVIEW_ROUNDS):
            try:
                record = self._review_once(proposal_id, reviewer, verdict, ttl, comment)
            except _Stale:
                continue  # another approval or an expiry moved the count: ask again
            break
        else:
            raise StoreBusy(
                f"the approvals of proposal {quote(proposal_id, 64)} kept changing while "
                f"this review was decided ({_REVIEW_ROUNDS} tries): review again"
            )
        log.info(
            "review proposal=%s verdict=%s by=%s via=%s",
            record.proposal_id,
            verdict.value,
            reviewer_name(reviewer),
            reviewer.authenticated_by,
        )
        return record

    def _review_once(
        self,
        proposal_id: str,
        reviewer: Reviewer,
        verdict: ReviewVerdict,
        ttl: timedelta,
        comment: str | None,
    ) -> ReviewRecord:
        """One round of :meth:`review`: read the proposal and who has approved it, ask
        OPA, record. _Stale when the approvals changed between the asking and the
        recording, so that the quorum OPA decided is the one the store holds."""
        proposal = read_proposal(self.store, proposal_id)  # the id checked first
        standing = standing_approvers(self.store, proposal.id)
        contract = self.catalogue.contract_at(proposal.tool, proposal.contract_version)
        facts = ReviewInput.model_validate(
            {
                "reviewer": reviewer,
                "proposal": {
                    "id": proposal.id,
                    "tenant": proposal.tenant,
                    "tool": proposal.tool,
                    "version": proposal.contract_version,
                    "status": proposal.status.value,
                    "proposer": proposal.proposer,
                    "approvers": sorted(standing),
                    # What a quorum may depend on, read as the dispatch will read it.
                    "values": (
                        values_of(contract, proposal.params, self.catalogue.currencies)
                        if contract
                        else {}
                    ),
                },
                "verdict": verdict.value,
            }
        )
        decision = _ask_review(self.policy, facts)
        row = LedgerEntry(
            kind="review",
            tenant=proposal.tenant,
            principal=reviewer_name(reviewer),
            tool=proposal.tool,
            contract_version=proposal.contract_version,
            operation_id=proposal.operation_id,
            proposal_id=proposal.id,
            decision_id=decision.decision_id,
            policy_revision=policy_revision(decision.bundle_revisions),
            detail={**reviewer_detail(reviewer), "commented": comment is not None},
        )
        if not decision.allow or decision.reasons:
            append(
                self.store,
                row.model_copy(
                    update={"outcome": "refused", "reason_codes": decision.reason_codes}
                ),
            )
            if decision.allow:  # an allow with reasons contradicts itself: refuse it
                raise PolicyUnavailable("OPA returned an inconsistent review allow")
            raise CapabilityViolation(
                f"review of {proposal.tool}", decision.reasons, decision_id=decision.decision_id
            )
        kind = contract.approval.value if contract is not None else "none"
        try:
            record = self._record(
                proposal, reviewer, verdict, kind, ttl, decision, row, comment, standing
            )
        except _Lost:
            # Another review got there first: this one was decided on stale facts. It is
            # recorded like any refusal, then refused.
            append(
                self.store,
                row.model_copy(
                    update={
                        "outcome": "refused",
                        "reason_codes": ["proposal_not_pending"],
                        "detail": {**row.detail, "after_allow": True},
                    }
                ),
            )
            raise CapabilityViolation(
                f"review of {proposal.tool}",
                [Reason(code="proposal_not_pending", message="the proposal is no longer pending")],
                decision_id=decision.decision_id,
            ) from None
        return record

    def _record(
        self,
        proposal: ProposalRecord,
        reviewer: Reviewer,
        verdict: ReviewVerdict,
        kind: str,
        ttl: timedelta,
        decision: ReviewDecision,
        row: LedgerEntry,
        comment: str | None,
        standing: frozenset[str],
    ) -> ReviewRecord:
        """In one transaction: the review, the proposal's new status, the ledger row;
        _Lost if the proposal is no longer pending, _Stale if an approval's people are
        no longer ``standing``, those OPA counted (read under the proposal's lock, so
        two reviewers completing a quorum at once cannot both be told short of it,
        nor one counted twice)."""
        with self.store.transaction() as tx:
            current = tx.get_proposal(proposal.id, for_update=True)
            if current is None or current.status is not ProposalStatus.PENDING:
                raise _Lost
            if verdict is ReviewVerdict.APPROVED and (
                _standing(tx.reviews(proposal.id), tx.now) != standing
            ):
                raise _Stale
            record = tx.insert_review(
                ReviewRecord(
                    id=f"rev-{uuid.uuid4().hex[:20]}",
                    proposal_id=proposal.id,
                    reviewer=reviewer,
                    verdict=verdict,
                    kind=kind,
                    tenant=proposal.tenant,
                    tool=proposal.tool,
                    operation_id=proposal.operation_id,
                    digest=proposal.params_digest,
                    expires_at=tx.now + ttl,
                    decision_id=decision.decision_id,
                    created_at=tx.now,
                    comment=comment,
                )
            )
            detail: dict[str, Any] = {**row.detail, "review": record.id}
            if verdict is ReviewVerdict.REJECTED:
                outcome = ProposalStatus.REJECTED.value
                tx.update_proposal(proposal.id, status=ProposalStatus.REJECTED, reason_codes=[])
            else:
                # Whether this approval completes the quorum is the policy's answer
                # (capgate.review's quorum_met); standing is what it counted.
                required = decision.approvals_required
                if required > 1:
                    approvals = len(standing | {person_of(reviewer)})
                    detail.update(approvals=approvals, approvals_required=required)
                if not decision.quorum_met:
                    outcome = AWAITING_QUORUM  # recorded, and the proposal stays pending
                else:
                    outcome = ProposalStatus.APPROVED.value
                    tx.update_proposal(proposal.id, status=ProposalStatus.APPROVED, reason_codes=[])
                    # Queued with the approval, in its transaction: no approved proposal
                    # is ever left without a job for the execution workers.
                    tx.queue_dispatch(proposal.id)
            tx.append(row.model_copy(update={"outcome": outcome, "detail": detail}))
        return record


def _ask_review(policy: ReviewPolicy, facts: ReviewInput) -> ReviewDecision:
    try:
        decision = policy.review(facts)
    except CapgateError:
        raise
    except Exception as exc:
        raise PolicyUnavailable(
            f"the policy decider failed on review ({type(exc).__name__}); failing closed"
        ) from exc
    if not isinstance(decision, ReviewDecision):
        raise PolicyUnavailable("the policy answered review with something else")
    return decision


def person_of(reviewer: Reviewer) -> str:
    """Who a quorum counts: the person an agent reviewer acts for, else the reviewer,
    compared without regard to case (as self_review compares them), so Maria and
    her assistant approving are one approval, not two."""
    return (reviewer.acts_for or reviewer.id).lower()


def _standing(reviews: Iterable[ReviewRecord], now: datetime) -> frozenset[str]:
    """The people whose approval among ``reviews`` is unexpired at ``now``."""
    return frozenset(
        person_of(r.reviewer)
        for r in reviews
        if r.verdict is ReviewVerdict.APPROVED and r.expires_at > now
    )


@dataclass(frozen=True)
class QuorumProgress:
    """How far a pending proposal that needs more than one reviewer has got: the
    distinct people whose approval stands now, of the number the review policy
    asked for at the last approval (its ledger row says so)."""

    approvals: int
    required: int


def quorum_progress(store: Store, proposal_id: str) -> QuorumProgress | None:
    """The progress of a pending proposal towards its quorum, for the people who
    review it; None for one that is not pending or needs one approval. The number
    asked is the policy's, as the last approval recorded it: before any approval the
    gateway has not asked, and says nothing rather than count on its own."""
    asked = [
        row.detail["approvals_required"]
        for row in store.ledger(proposal_id=proposal_id)
        if row.kind == "review" and isinstance(row.detail.get("approvals_required"), int)
    ]
    if not asked or asked[-1] <= 1:
        return None
    with store.transaction(read_only=True) as tx:
        proposal = tx.get_proposal(proposal_id)
        if proposal is None or proposal.status is not ProposalStatus.PENDING:
            return None
        approvals = len(_standing(tx.reviews(proposal_id), tx.now))
    return QuorumProgress(approvals=approvals, required=asked[-1])


def standing_approvers(store: Store, proposal_id: str) -> frozenset[str]:
    """The people whose approval of the proposal stands now, by the store's clock:
    what the review policy counts towards the quorum with the next approval."""
    with store.transaction(read_only=True) as tx:
        return _standing(tx.reviews(proposal_id), tx.now)


def approvals_of(store: Store, proposal_id: str) -> list[ReviewRecord]:
    """The proposal's approving reviews, oldest first."""
    with store.transaction(read_only=True) as tx:
        return [r for r in tx.reviews(proposal_id) if r.verdict is ReviewVerdict.APPROVED]


def latest_approval(store: Store, proposal_id: str) -> ReviewRecord | None:
    approvals = approvals_of(store, proposal_id)
    return approvals[-1] if approvals else None


def approval_fact(
    review: ReviewRecord | None,
    proposal: ProposalRecord,
    approvals: list[ReviewRecord] | None = None,
) -> Approval | None:
    """The approval as OPA sees it: the latest (``review``), with every approving
    review of the proposal as its approvers, whom the policy counts against the
    contract's quorum. ``used`` means consumed by anything but this very operation:
    a dispatched proposal whose outcome was unknown is continued, not approved
    twice (the approval binds its one operation id)."""
    if review is None:
        return None
    approvers = [
        Approver(by=person_of(approval.reviewer), expires_at=approval.expires_at)
        for approval in (approvals or [review])
    ]
    return Approval(
        kind=review.kind,
        tool=review.tool,
        operation_id=review.operation_id,
        tenant=review.tenant,
        digest=review.digest,
        expires_at=review.expires_at,
        approved_by=review.reviewer.id,
        used=review.consumed_at is not None and proposal.status is not ProposalStatus.DISPATCHED,
        approvers=approvers[-64:],
    )


def block(
    store: Store,
    proposal: ProposalRecord,
    codes: list[str],
    decision_id: str | None,
    revision: str | None = None,
) -> None:
    """Block an approved proposal whose dispatch was denied. A pending one is left
    pending: dispatched before its review, it was early, not overtaken by events,
    and blocking it would make it impossible to review.

    So is a dispatched one whose last attempt came back ``retryable`` (nothing
    happened) and whose retry is denied: it will not be sent, and blocked is what
    it is. One whose operation is running, or whose outcome is unknown (it may
    have happened: a lookup settles it, no allow needed), stays dispatched."""
    with store.transaction() as tx:
        current = tx.get_proposal(proposal.id, for_update=True)
        if current is None:
            return
        if current.status is ProposalStatus.DISPATCHED:
            operation = tx.get_operation(current.tenant, current.operation_id)
            last = None if operation is None or operation.outcome is None else operation.outcome
            if last is None or last.get("status") != OutcomeStatus.RETRYABLE.value:
                return
        elif current.status is not ProposalStatus.APPROVED:
            return
        tx.update_proposal(proposal.id, status=ProposalStatus.BLOCKED, reason_codes=codes)
        tx.append(
            LedgerEntry(
                kind="dispatch",
                tenant=proposal.tenant,
                principal=who(proposal.proposer),
                tool=proposal.tool,
                contract_version=proposal.contract_version,
                operation_id=proposal.operation_id,
                proposal_id=proposal.id,
                decision_id=decision_id,
                policy_revision=revision,
                outcome=ProposalStatus.BLOCKED.value,
                reason_codes=codes,
            )
        )
    log.info("blocked proposal=%s reasons=%s", proposal.id, ",".join(codes))


def read_proposal(store: Store, proposal_id: str) -> ProposalRecord:
    """The proposal of that id, or UnknownProposal (InvalidInput for a non-string)."""
    if not isinstance(proposal_id, str):
        raise InvalidInput(f"a proposal id is a string, not a {type(proposal_id).__name__}")
    with store.transaction(read_only=True) as tx:
        proposal = tx.get_proposal(proposal_id)
    if proposal is None:
        raise UnknownProposal(proposal_id)
    return proposal
