"""The review desk: what a reviewer may see and decide, and what an agent may ask of
its own proposals, written once for every front (MCP tools, the inbox, a chat bot).

A front authenticates its caller and hands the desk a
:class:`~capgate.gateway.model.facts.Reviewer` (or, for an agent asking after its
proposals, the :class:`~capgate.gateway.model.facts.Principal` of its binding). The
desk never takes an identity from a request's arguments, and never widens what the
caller may see:

- **A reviewer sees their tenant's proposals only.** Another tenant's id reads as
  unknown, the same answer as an id that exists nowhere.
- **A decision goes through** ``Gateway.review``: the review policy decides, and
  every refusal is a ledger row. A proposal decided already is refused by that
  policy (``proposal_not_pending``), which fronts show as ``already_decided``.
- **A decision names what it decides on**: the digest of the content the reviewer
  was shown. When it is not the proposal's digest now, or the stored content no
  longer hashes to it (the store was altered), the decision is refused as
  :class:`~capgate.gateway.errors.ProposalStale` before OPA is asked, and nothing is
  written: the reviewer looks again.
- **An agent sees its own proposals only**: those its principal (agent and tenant)
  proposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from capgate.gateway.digest import params_digest
from capgate.gateway.errors import CapgateError, InvalidInput, ProposalStale, UnknownProposal, quote
from capgate.gateway.model.comments import review_comment
from capgate.gateway.model.facts import Identifier, Principal, Reviewer
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.proposals import QuorumProgress, quorum_progress
from capgate.gateway.state.records import (
    ConnectionRecord,
    OperationRecord,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)

__all__ = ["MAX_LISTED", "ProposalView", "ReviewDesk"]

_IDENTIFIER: Final = TypeAdapter(Identifier)
#: The most proposals one listing returns (the oldest pending first; an agent's
#: newest first).
MAX_LISTED: Final = 50


@dataclass(frozen=True)
class ProposalView:
    """One proposal as a reviewer or its agent sees it, with what bears on it now."""

    proposal: ProposalRecord
    #: Whether the stored parameters still hash to the digest an approval binds.
    digest_matches: bool
    reviews: list[ReviewRecord]
    #: The operation that carries it, once dispatched (its outcome, receipt, attempts).
    operation: OperationRecord | None
    #: The tenant connection the tool acts through, as it stands now (``None`` for a
    #: tool that acts through none, or an alias the tenant does not have): a reviewer
    #: sees whether the facts the proposal was made under still hold.
    connection_alias: str | None = None
    connection: ConnectionRecord | None = None
    #: For a pending proposal that needs more than one reviewer, once one approved:
    #: how many distinct people have, of how many the policy asks.
    quorum: QuorumProgress | None = None

    def outcome(self) -> dict[str, Any] | None:
        """Once dispatched and settled: its status, the provider's receipt, attempts."""
        if self.operation is None or self.operation.outcome is None:
            return None
        return {
            "status": self.operation.outcome.get("status"),
            "receipt": self.operation.outcome.get("provider_receipt"),
            "attempts": self.operation.attempts,
        }


class ReviewDesk:
    """The desk of one gateway, for every front that reviews or asks after proposals."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    # -- reviewers ---------------------------------------------------------------------------

    def pending(self, reviewer: Reviewer) -> list[ProposalRecord]:
        """The reviewer's tenant's pending proposals, oldest first (at most
        :data:`MAX_LISTED`). The review policy still decides each verdict."""
        with self.gateway.store.transaction(read_only=True) as tx:
            pending = tx.list_proposals(tenant=reviewer.tenant, status=ProposalStatus.PENDING)
        return pending[:MAX_LISTED]

    def history(self, reviewer: Reviewer, limit: int = MAX_LISTED) -> list[ProposalRecord]:
        """The reviewer's tenant's decided proposals (every state but pending), the most
        recently changed first."""
        with self.gateway.store.transaction(read_only=True) as tx:
            proposals = tx.list_proposals(tenant=reviewer.tenant)
        decided = [p for p in proposals if p.status is not ProposalStatus.PENDING]
        decided.sort(key=lambda p: p.updated_at, reverse=True)
        return decided[:limit]

    def show(self, reviewer: Reviewer, proposal_id: str) -> ProposalView:
        """One proposal of the reviewer's tenant; UnknownProposal for any other."""
        return self._view(_checked_id(proposal_id), tenant=reviewer.tenant, agent=None)

    def decide(
        self,
        reviewer: Reviewer,
        proposal_id: str,
        verdict: ReviewVerdict | str,
        *,
        digest: str,
        comment: str | None = None,
    ) -> ReviewRecord:
        """Approve or reject the proposal whose content hashes to ``digest``.

        ProposalStale when that is not the proposal's content now (nothing written);
        else :meth:`Gateway.review`'s answer: CapabilityViolation for a refusal
        (recorded), ``proposal_not_pending`` among its codes when it was decided
        already. Another tenant's proposal is asked of the policy like any other, so
        the attempt is refused (``tenant_mismatch``) and recorded. ``comment`` is kept
        with the verdict (InvalidInput naming ``comment`` for one that breaks the
        rule of :mod:`capgate.gateway.model.comments`, before anything is read).
        """
        proposal_id = _checked_id(proposal_id)
        if not isinstance(digest, str) or not digest:
            raise InvalidInput("digest: give the digest of the content you were shown")
        comment = review_comment(comment)
        with self.gateway.store.transaction(read_only=True) as tx:
            proposal = tx.get_proposal(proposal_id)
        if proposal is None:
            raise UnknownProposal(proposal_id)
        if proposal.tenant == reviewer.tenant and not _is_current(proposal, digest):
            raise ProposalStale(proposal.id)
        return self.gateway.review(proposal.id, reviewer, verdict, comment=comment)

    def progress(self, proposal_id: str) -> QuorumProgress | None:
        """After an approval: how far the proposal is from its quorum, when it still
        waits for more reviewers (None once approved, or for one that needs one)."""
        return quorum_progress(self.gateway.store, proposal_id)

    # -- agents ------------------------------------------------------------------------------

    def own(self, principal: Principal, limit: int = MAX_LISTED) -> list[ProposalRecord]:
        """The proposals this agent (this agent, of this tenant) made, newest first."""
        with self.gateway.store.transaction(read_only=True) as tx:
            proposals = tx.list_proposals(tenant=principal.tenant)
        mine = [p for p in proposals if p.proposer.agent == principal.agent]
        return list(reversed(mine))[:limit]

    def own_one(self, principal: Principal, proposal_id: str) -> ProposalView:
        """One of this agent's own proposals; UnknownProposal for anyone else's."""
        return self._view(_checked_id(proposal_id), tenant=principal.tenant, agent=principal.agent)

    # -- shared --------------------------------------------------------------------------------

    def _view(self, proposal_id: str, *, tenant: str, agent: str | None) -> ProposalView:
        with self.gateway.store.transaction(read_only=True) as tx:
            proposal = tx.get_proposal(proposal_id)
            if (
                proposal is None
                or proposal.tenant != tenant
                or (agent is not None and proposal.proposer.agent != agent)
            ):
                # The same answer for an id of another tenant (or agent) as for none.
                raise UnknownProposal(proposal_id)
            reviews = tx.reviews(proposal.id)
            operation = tx.get_operation(proposal.tenant, proposal.operation_id)
            contract = self.gateway.catalogue.contract_at(proposal.tool, proposal.contract_version)
            alias = contract.connection_alias if contract is not None else None
            connection = tx.connections(proposal.tenant).get(alias) if alias else None
        return ProposalView(
            proposal=proposal,
            digest_matches=_is_current(proposal, proposal.params_digest),
            reviews=reviews,
            operation=operation if proposal.status is ProposalStatus.DISPATCHED else None,
            connection_alias=alias,
            connection=connection,
            quorum=quorum_progress(self.gateway.store, proposal.id),
        )


def _is_current(proposal: ProposalRecord, digest: str) -> bool:
    """``digest`` is the proposal's, and its stored parameters still hash to it."""
    try:
        recomputed = params_digest(proposal.params)
    except CapgateError:
        return False
    return digest == proposal.params_digest == recomputed


def _checked_id(proposal_id: object) -> str:
    """The id as the store's identifiers are checked (the one Identifier rule)."""
    try:
        return str(_IDENTIFIER.validate_python(proposal_id))
    except ValidationError:
        raise InvalidInput(f"proposal_id: {quote(proposal_id, 40)} is not a proposal id") from None
